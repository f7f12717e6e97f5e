"""A real S3-compatible endpoint for the tests: `moto_server` (moto[server], PyPI) on 127.0.0.1, with a
bucket, and the storage options that point delta-rs and pyarrow at it (the names a deployment sets in the
environment, settings.STORAGE_ENV)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engagement_platform_tests.support.secrets_scan import RUN_SECRETS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_listening(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 30.0) -> None:
    """Until the server started as `proc` accepts connections on `port`; RuntimeError with its log if it dies or is late."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if the server is still there after a few seconds (Azurite can linger on open connections)."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextmanager
def s3_endpoint(log: Path) -> Iterator[dict[str, str]]:
    """Start moto_server; yield the storage options of a fresh bucket's lake (`lake_root` among them)."""
    port = free_port()
    moto = Path(sys.executable).with_name("moto_server")
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    secret = RUN_SECRETS["AWS_SECRET_ACCESS_KEY"]  # distinctive, so the run's leak check can find it anywhere
    options = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }
    try:
        wait_until_listening(port, proc, log)
        bucket = f"lake-{uuid.uuid4().hex[:8]}"
        import pyarrow.fs as pafs

        pafs.S3FileSystem(
            access_key="test",
            secret_key=secret,
            region="us-east-1",
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
        ).create_dir(bucket)
        yield {**options, "bucket": bucket}
    finally:
        stop(proc)


AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # its well-known dev key
)
AZURITE = (
    Path(__file__).resolve().parents[2]
    / ".state"
    / "tools"
    / "azurite-3.37.0"
    / "node_modules"
    / ".bin"
    / "azurite-blob"
)


@contextmanager
def azurite_endpoint(folder: Path) -> Iterator[dict[str, str]]:
    """Start Azure's storage emulator (Azurite, installed by scripts/install.sh); yield the storage options of
    a fresh container's lake (`bucket`: the container)."""
    import pyarrow.fs as pafs

    port = free_port()
    account = "devstoreaccount1"
    with open(folder / "azurite.log", "ab") as out:
        proc = subprocess.Popen(
            [
                str(AZURITE),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--location",
                str(folder / "azurite"),
                "--skipApiVersionCheck",
                "--loose",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    options = {
        "AZURE_STORAGE_ACCOUNT_NAME": account,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        "AZURE_ENDPOINT": f"http://127.0.0.1:{port}/{account}",
        "AZURE_ALLOW_HTTP": "true",
    }
    try:
        wait_until_listening(port, proc, folder / "azurite.log")
        container = f"lake{uuid.uuid4().hex[:8]}"
        authority = f"127.0.0.1:{port}"
        pafs.AzureFileSystem(
            account_name=account,
            account_key=AZURITE_KEY,
            blob_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_authority=authority,
            dfs_storage_scheme="http",
        ).create_dir(container)
        yield {**options, "bucket": container}
    finally:
        stop(proc)
