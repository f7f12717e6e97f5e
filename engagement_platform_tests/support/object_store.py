"""Real object-store servers for the tests, on 127.0.0.1: an S3 endpoint (`moto_server`, moto[server] on PyPI) and
Azure's storage emulator (Azurite, installed by scripts/install.sh). A server runs once per test run (conftest's
session fixtures start it on first use) and each test takes a fresh bucket (a container on Azure) of its own, with
the storage options that point delta-rs and pyarrow at it (the names a deployment sets in the environment,
settings.STORAGE_ENV). Each server logs into the folder it is given: the run's leak check searches it."""

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

OBJECT_STORE_FIXTURES = frozenset({"s3_server", "azurite_server"})  # conftest's: a test using one is `objectstore`
AZURITE_ACCOUNT = "devstoreaccount1"
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_listening(port: int, proc: subprocess.Popen, log: Path, timeout_s: float = 30.0) -> None:
    """Until the server started as `proc` accepts connections on `port`; RuntimeError with its log if it dies or is
    late."""
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
    """SIGTERM, then SIGKILL if the server is still there after a few seconds (Azurite can linger on open
    connections)."""
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class ObjectStoreServer:
    """A running server: its log, the storage options that reach it, and a pyarrow file system on it that
    creates and drops buckets."""

    def __init__(self, log: Path, options: dict[str, str], filesystem, bucket_prefix: str):
        self.log, self.options, self.filesystem, self.bucket_prefix = log, options, filesystem, bucket_prefix

    @contextmanager
    def fresh_bucket(self) -> Iterator[dict[str, str]]:
        """A bucket of its own for one test: yields the storage options with `bucket` among them; the bucket and
        what it holds are dropped afterwards, so the server's memory does not grow with the run."""
        bucket = f"{self.bucket_prefix}{uuid.uuid4().hex[:8]}"
        self.filesystem.create_dir(bucket)
        try:
            yield {**self.options, "bucket": bucket}
        finally:
            try:
                self.filesystem.delete_dir(bucket)
            except Exception:  # only frees memory: a bucket already gone or a dead server must not fail the test
                pass


@contextmanager
def running_moto(log: Path) -> Iterator[ObjectStoreServer]:
    """Start moto_server (in memory, logging every request to `log`); stop it on exit."""
    import pyarrow.fs as pafs

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
        filesystem = pafs.S3FileSystem(
            access_key="test",
            secret_key=secret,
            region="us-east-1",
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )
        yield ObjectStoreServer(log, options, filesystem, "lake-")
    finally:
        stop(proc)


@contextmanager
def running_azurite(folder: Path) -> Iterator[ObjectStoreServer]:
    """Start Azurite's blob service (its data and azurite.log under `folder`); stop it on exit."""
    import pyarrow.fs as pafs

    port = free_port()
    log = folder / "azurite.log"
    with open(log, "ab") as out:
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
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
        "AZURE_ENDPOINT": f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}",
        "AZURE_ALLOW_HTTP": "true",
    }
    try:
        wait_until_listening(port, proc, log)
        authority = f"127.0.0.1:{port}"
        filesystem = pafs.AzureFileSystem(
            account_name=AZURITE_ACCOUNT,
            account_key=AZURITE_KEY,
            blob_storage_authority=authority,
            blob_storage_scheme="http",
            dfs_storage_authority=authority,
            dfs_storage_scheme="http",
        )
        yield ObjectStoreServer(log, options, filesystem, "lake")  # container names: lowercase letters and digits
    finally:
        stop(proc)
