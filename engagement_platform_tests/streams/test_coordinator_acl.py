"""A secured coordinator (EP_ZK_AUTH, digest auth) on the real ZooKeeper: every node it creates (lock,
registration, fencing token, run liveness) is readable and writable by its identity only, so a client
without the credentials (or with wrong ones) can neither take nor delete the lock nor read or change
what fencing relies on, and the lease still holds after such attempts."""

from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from engagement_platform.streams.coordinator import Coordinator, JobSpec

AUTH = "platform:s3cret"


def nodes(client: KazooClient, path: str) -> list[str]:
    out = [path]
    for child in client.get_children(path):
        out += nodes(client, f"{path}/{child}")
    return out


def test_an_unauthenticated_client_can_neither_read_nor_change_the_coordinators_nodes(stack):
    hosts = stack["ZOOKEEPER_HOSTS"]
    root = f"/secured-{uuid.uuid4().hex}"  # top level: its parent is not one other tests create under
    secured = Coordinator(hosts, root, 20.0, auth=AUTH)
    intruders = [KazooClient(hosts=hosts), KazooClient(hosts=hosts, auth_data=[("digest", "platform:wrong")])]
    try:
        secured.start()
        for client in intruders:
            client.start(timeout=10)
        with secured.batch(JobSpec("engagement_activity", "ingestion"), "ingestion/7", 5.0) as lease:
            created = nodes(secured.client, root)
            assert lease.path in created and len(created) > 3, created
            for client in intruders:
                for path in created:
                    with pytest.raises(NoAuthError):
                        client.get(path)
                    with pytest.raises(NoAuthError):
                        client.set(path, b"taken")
                with pytest.raises(NoAuthError):
                    client.delete(lease.path)
                with pytest.raises(NoAuthError):
                    client.create(f"{root}/locks/engagement_activity/intruder-", ephemeral=True, sequence=True)
            lease.check()  # still the holder: fencing holds
            colleague = Coordinator(hosts, root, 20.0, auth=AUTH)  # the same credentials: another platform process
            try:
                colleague.start()
                assert "ingestion/7" in (colleague.holder("engagement_activity") or "")
            finally:
                colleague.close()
    finally:
        for client in intruders:
            client.stop()
            client.close()
        secured.close()


def test_auth_must_name_a_user_and_a_password():
    with pytest.raises(ValueError, match="user:password"):
        Coordinator("127.0.0.1:1", "/x", auth="no-colon")
