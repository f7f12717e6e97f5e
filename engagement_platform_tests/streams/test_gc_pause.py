import gc

import pytest

from engagement_platform.streams.gc_pause import no_cyclic_gc


def test_the_collector_is_paused_inside_and_restored_after_an_error():
    assert gc.isenabled()
    with pytest.raises(ValueError):
        with no_cyclic_gc():
            assert not gc.isenabled()
            raise ValueError("boom")
    assert gc.isenabled()


def test_a_collector_already_off_stays_off():
    gc.disable()
    try:
        with no_cyclic_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
