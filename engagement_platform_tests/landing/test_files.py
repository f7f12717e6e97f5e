"""Which waiting landing files the next batch reads: property tests of next_batch_files (pure)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engagement_platform.landing.files import LandedFile, next_batch_files

waiting_files = st.lists(st.integers(0, 1000), max_size=30).map(
    lambda sizes: [LandedFile(f"/landing/m/{i:03d}.csv", size, 0.0) for i, size in enumerate(sizes)]
)


@settings(max_examples=200, deadline=None)
@given(waiting_files, st.integers(1, 10), st.integers(1, 3000))
def test_the_next_batch_is_the_longest_prefix_within_both_bounds(waiting, max_files, max_bytes):
    chosen = next_batch_files(waiting, max_files, max_bytes)
    assert chosen == waiting[: len(chosen)], "files are read in path order, none skipped"
    assert bool(chosen) == bool(waiting), "a waiting file is never left waiting by an empty batch"
    assert len(chosen) <= max_files
    assert len(chosen) == 1 or sum(f.size for f in chosen) <= max_bytes, "only a lone file may exceed the byte bound"
    if len(chosen) < min(len(waiting), max_files):  # stopped early: the next file would break the byte bound
        assert sum(f.size for f in waiting[: len(chosen) + 1]) > max_bytes


def test_a_file_bigger_than_the_byte_bound_is_a_batch_alone():
    big, small = LandedFile("/l/a.csv", 50, 0.0), LandedFile("/l/b.csv", 1, 0.0)
    assert next_batch_files([big, small], 10, 10) == [big]
    assert next_batch_files([small, big], 10, 10) == [small]
