"""The whole test run as a leak check: the suite runs with distinctive secret values (the erasure key, the
S3 endpoint's secret key), and at the end every file the run left behind (the stack's server logs, every
test's temporary folder: Dagster instances' event logs, CLI and server logs, lakes) is searched for them,
in clear and hex-encoded. Secrets that travel with Spark tasks must never be written by anyone."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path

# Set before any server or fixture starts (conftest's pytest_configure): every process inherits them.
RUN_SECRETS = {
    "EP_ERASURE_SECRET": f"ep-erasure-{uuid.uuid4().hex}",
    "AWS_SECRET_ACCESS_KEY": f"ep-s3-{uuid.uuid4().hex}",  # the local S3 endpoint checks no signature
}
CHUNK = 8 << 20


def forms(value: str) -> list[bytes]:
    """How a secret can appear in a file: as it is, and hex-encoded (the erasure key travels as hex)."""
    raw = value.encode()
    return [raw, raw.hex().encode()]


def files_holding(secrets: Mapping[str, str], roots: Iterable[Path]) -> tuple[list[tuple[str, str]], int, int]:
    """([(file, secret name)] for every file under `roots` holding a secret, files searched, bytes searched).
    Files are read in chunks that overlap by the longest needle, so a value across a chunk border is found."""
    needles = [(name, form) for name, value in secrets.items() for form in forms(value)]
    overlap = max(len(n) for _, n in needles) - 1
    hits, files, size = [], 0, 0
    for root in roots:
        if not root.exists():
            continue
        for folder, _, names in os.walk(root):
            for file_name in names:
                path = Path(folder, file_name)
                if path.is_symlink() or not path.is_file():
                    continue
                files += 1
                found, tail = set(), b""
                try:
                    with open(path, "rb") as f:
                        while chunk := f.read(CHUNK):
                            size += len(chunk)
                            window = tail + chunk
                            found |= {name for name, needle in needles if needle in window}
                            tail = window[-overlap:] if overlap else b""
                except OSError:  # a socket or a file removed meanwhile
                    continue
                hits += [(str(path), name) for name in sorted(found)]
    return hits, files, size
