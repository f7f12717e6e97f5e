"""Input on the driver's local disk read by Spark tasks: fine where the executors see the same disk (local mode,
one host, a folder every node mounts at the same path), a missing file where they do not. A read of such input
that fails for a missing file on a cluster is re-raised saying so, instead of as an executor's stack trace."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

# How a missing file reads in Spark's errors (its own readers) and in pyarrow's and Python's (the platform's tasks).
MISSING_FILE = ("PATH_NOT_FOUND", "FileNotFound", "does not exist", "No such file")


class LocalInputError(RuntimeError):
    """Input on the driver's disk that the cluster's executors cannot read."""


def is_local_path(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def spark_master(spark: SparkSession) -> str:
    return spark.conf.get("spark.master", "local") or "local"


@contextmanager
def local_input_read_by_tasks(spark: SparkSession, what: str, paths: Iterable[str]) -> Iterator[None]:
    """Run the Spark actions that read `paths` (the input named `what`) in this block."""
    try:
        yield
    except Exception as exc:
        local = [p for p in map(str, paths) if is_local_path(p)]
        if not local or not any(marker in str(exc) for marker in MISSING_FILE):
            raise
        master = spark_master(spark)
        if master.startswith("local"):
            raise
        more = f" and {len(local) - 1} more file(s)" if len(local) > 1 else ""
        raise LocalInputError(
            f"{what} {local[0]}{more} is on the driver's disk and the Spark executors ({master}) could not read it: "
            "put it on the lake's object store, or in a folder every node mounts at the same path"
        ) from exc
