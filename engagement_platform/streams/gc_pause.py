"""Pausing Python's cycle collector around hot loops that build many small objects.

The collector's full passes scan every live container, so a loop that builds hundreds of thousands
of dicts and lists (none of them in a reference cycle) pays for scanning them again and again:
a large share of the profile fold, the cascade fold and the Kafka fetch loop (BENCHMARKS.md).
Reference counting still frees everything; only cyclic garbage waits until the collector is back.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_cyclic_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
