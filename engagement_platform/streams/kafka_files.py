"""Kafka client settings for Spark tasks, which may run on other nodes than the driver: TLS material named by
file path on the driver (`ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`) goes to the tasks as
its contents (librdkafka's `ssl.*.pem` settings), so an executor needs no copy of the files. A CA folder, the
`probe` value and keystores (no PEM twin) are passed as given: those must exist on every node."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

PEM_TWINS = {
    "ssl.ca.location": "ssl.ca.pem",
    "ssl.certificate.location": "ssl.certificate.pem",
    "ssl.key.location": "ssl.key.pem",
}


def for_executors(config: Mapping[str, str]) -> dict[str, str]:
    """`config` with each PEM file the driver names replaced by its contents."""
    out = dict(config)
    for location, pem in PEM_TWINS.items():
        path = out.get(location)
        if path and pem not in out and Path(path).is_file():
            out[pem] = Path(path).read_text()
            del out[location]
    return out
