"""Job coordinator over ZooKeeper (kazoo): one lock per shared resource, a predecessor CAS, fencing.

The reference's workflow per micro-batch: lock the shared resource (e.g. the engagement_activity
table) or give up after a timeout; check that the last job registered on that lock is an allowed
predecessor and register this job (compare-and-swap on the znode version) or give up and release;
process and commit; release. A give-up commits nothing: the batch is retried on a later tick from
its stored plan.

ZooKeeper layout under `root`:
    locks/<lock_name>/<uuid>__lock__<seq>   kazoo's Lock recipe: ephemeral sequential, lowest holds it
    predecessors/<lock_name>                JSON {job, owner, token, at}: the last registered job

Fencing: the lock znode's sequence number is the lease's token; it only grows per lock. A writer
calls `Lease.check()` right before each commit (LeaseLost once the session is not connected, was
replaced after expiry, or the znode is gone) and writes the token into the commit's metadata.

Retries of the same batch: `owner` names the batch (e.g. "mutation/7"), not the process. A batch
that registered and then crashed finds its own record on the predecessor znode when it is retried;
`register` accepts that record (same job, same owner) whatever the predecessor set says, so a batch
is never blocked by its own earlier registration.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, LockTimeout, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

OP_TIMEOUT_S = 5.0  # upper bound for one ZooKeeper round trip we wait on (check, unlock, register)


@dataclass(frozen=True)
class JobSpec:
    """One stream's coordination config."""

    lock_name: str  # the shared resource, e.g. "engagement_activity"
    job_name: str  # e.g. "ingestion"
    predecessors: frozenset[str] = frozenset()  # allowed last-registered jobs; empty = any


class CoordinationGaveUp(Exception):
    """Lock timeout, predecessor mismatch or ZooKeeper unreachable: nothing committed, retry next tick."""


class LeaseLost(Exception):
    """The lock is no longer held (session lost, expired or znode gone): the writer must not commit."""


class Lease:
    """A held lock. `token` is the lock znode's sequence number (the fencing token)."""

    def __init__(self, coordinator: Coordinator, lock_name: str, owner: str, token: int, path: str, session_id: int):
        self._coordinator = coordinator
        self.lock_name, self.owner, self.token = lock_name, owner, token
        self.path, self.session_id = path, session_id

    def check(self) -> None:
        """Raise LeaseLost unless the session is connected and our znode is still the lock holder."""
        self._coordinator._check(self)

    def __repr__(self) -> str:
        return f"Lease({self.lock_name!r}, owner={self.owner!r}, token={self.token})"


def allowed(current: dict | None, job_name: str, owner: str, predecessors: frozenset[str]) -> bool:
    """The predecessor rule (pure): nobody registered yet, a retry of the same batch, any job when
    the set is empty, else the last registered job must be in the set."""
    if not current:
        return True
    if current.get("job") == job_name and current.get("owner") == owner:
        return True
    return not predecessors or current.get("job") in predecessors


class Coordinator:
    def __init__(self, hosts: str, root: str = "/engagement_platform", session_timeout_s: float = 10.0):
        self.hosts, self.root = hosts, "/" + root.strip("/")
        self.session_timeout_s = session_timeout_s
        # Reconnect quickly after a server restart (default backoff grows to a minute).
        self.client = KazooClient(hosts=hosts, timeout=session_timeout_s,
                                  connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0})
        self._stale: set[tuple[str, int]] = set()  # lock znodes an unlock could not delete (server away)
        self._started = False  # once started, kazoo reconnects by itself: never restart a suspended client

    # ---- session ------------------------------------------------------------------------------

    def start(self, timeout_s: float = 5.0) -> None:
        """Open the session (idempotent); CoordinationGaveUp when ZooKeeper does not answer in time."""
        if self._started:
            return
        try:
            self.client.start(timeout=timeout_s)
            self._started = True
        except KazooTimeoutError as e:  # start() already stopped and closed the client; start() again works
            raise CoordinationGaveUp(f"ZooKeeper {self.hosts} unreachable within {timeout_s:g}s") from e

    def close(self) -> None:
        """End the session: ZooKeeper deletes our ephemeral lock znodes at once."""
        self._started = False
        try:
            self.client.stop()
        finally:
            self.client.close()

    def _abandon_if_disconnected(self) -> None:
        if not self.client.connected:
            self._started = False  # the next lock() opens a new session
            self.client.stop()

    def _session_id(self) -> int | None:
        return self.client.client_id[0] if self.client.client_id else None

    # ---- lock ---------------------------------------------------------------------------------

    def lock(self, lock_name: str, owner: str, timeout_s: float) -> Lease:
        """Wait up to `timeout_s` for the lock; CoordinationGaveUp after that."""
        self.start(timeout_s=max(min(timeout_s, OP_TIMEOUT_S), 0.5))
        deadline = time.monotonic() + timeout_s
        while not self.client.connected:  # reconnecting after a server restart: kazoo retries by itself
            if time.monotonic() >= deadline:
                raise CoordinationGaveUp(f"lock {lock_name}: ZooKeeper {self.hosts} not reconnected within {timeout_s:g}s")
            time.sleep(0.05)
        self._sweep_stale()  # our own lock znodes an unlock could not delete while the server was away
        identity = json.dumps({"owner": owner, "host": socket.gethostname(), "pid": os.getpid()})
        recipe = self.client.Lock(f"{self.root}/locks/{lock_name}", identifier=identity)
        # kazoo's recipe makes blocking calls, which wait for as long as the server is away: past the
        # deadline, drop the session (our znode goes with it) so they fail and we can give up.
        watchdog = threading.Timer(timeout_s + OP_TIMEOUT_S, self._abandon_if_disconnected)
        watchdog.daemon = True
        watchdog.start()
        try:
            acquired = recipe.acquire(timeout=max(deadline - time.monotonic(), 0.01))
        except LockTimeout:
            acquired = False
        except KazooException as e:
            raise CoordinationGaveUp(f"lock {lock_name}: ZooKeeper error {type(e).__name__}") from e
        finally:
            watchdog.cancel()
        if not acquired:
            holder = self.holder(lock_name) if self.client.connected else "unknown: ZooKeeper unreachable"
            raise CoordinationGaveUp(f"lock {lock_name} not obtained within {timeout_s:g}s (held by {holder})")
        path = f"{recipe.path}/{recipe.node}"
        lease = Lease(self, lock_name, owner, int(recipe.node[-10:]), path, self._session_id() or 0)
        try:
            lease.check()
        except LeaseLost as e:  # the session changed between acquire and now
            self.unlock(lease)
            raise CoordinationGaveUp(str(e)) from e
        return lease

    def holder(self, lock_name: str) -> str | None:
        """Identity (JSON) written by the current lock holder, for messages; None if free or unknown."""
        try:
            recipe = self.client.Lock(f"{self.root}/locks/{lock_name}")
            contenders = recipe.contenders()
        except KazooException:
            return None
        return contenders[0] if contenders else None

    def _check(self, lease: Lease) -> None:
        client = self.client
        if client.state != KazooState.CONNECTED:
            raise LeaseLost(f"{lease}: ZooKeeper session {client.state.lower()}")
        if self._session_id() != lease.session_id:
            raise LeaseLost(f"{lease}: session {lease.session_id:#x} expired (now {self._session_id() or 0:#x})")
        try:
            stat = client.exists_async(lease.path).get(timeout=OP_TIMEOUT_S)
        except (KazooException, KazooTimeoutError) as e:
            raise LeaseLost(f"{lease}: cannot verify the lock ({type(e).__name__})") from e
        if stat is None or stat.ephemeralOwner != lease.session_id:
            raise LeaseLost(f"{lease}: lock znode {lease.path} is gone")

    def unlock(self, lease: Lease) -> None:
        """Delete our lock znode. If the server is away, remember it: the next lock() of this
        session deletes it, and closing or losing the session deletes it anyway (ephemeral)."""
        if self.client.state != KazooState.CONNECTED:  # a request now would wait for the reconnect
            self._stale.add((lease.path, lease.session_id))
            return
        try:
            self.client.delete_async(lease.path).get(timeout=OP_TIMEOUT_S)
        except NoNodeError:
            pass
        except (KazooException, KazooTimeoutError):
            self._stale.add((lease.path, lease.session_id))

    def _sweep_stale(self) -> None:
        for path, session in list(self._stale):
            if session == self._session_id():
                try:
                    self.client.delete_async(path).get(timeout=OP_TIMEOUT_S)
                except (KazooException, KazooTimeoutError):
                    pass  # gone already; or still there and our lock attempt waits behind it until it gives up
            self._stale.discard((path, session))

    # ---- predecessor ----------------------------------------------------------------------------

    def predecessor_path(self, lock_name: str) -> str:
        return f"{self.root}/predecessors/{lock_name}"

    def last_registered(self, lock_name: str) -> dict | None:
        try:
            data, _ = self.client.get(self.predecessor_path(lock_name))
        except NoNodeError:
            return None
        return json.loads(data) if data else None

    def register(self, lease: Lease, job_name: str, predecessors: frozenset[str]) -> None:
        """Register `job_name` as the last job on the lease's lock if the last registered job is an
        allowed predecessor (see `allowed`); a compare-and-swap on the znode's version, so a
        registration that raced ours (a fencing failure) makes this one give up."""
        lease.check()
        path = self.predecessor_path(lease.lock_name)
        record = json.dumps({"job": job_name, "owner": lease.owner, "token": lease.token,
                             "at": datetime.now(timezone.utc).isoformat()}).encode()
        try:
            try:
                data, stat = self.client.get_async(path).get(timeout=OP_TIMEOUT_S)
            except NoNodeError:
                current, version = None, None
            else:
                current, version = (json.loads(data) if data else None), stat.version
            if not allowed(current, job_name, lease.owner, predecessors):
                raise CoordinationGaveUp(f"{job_name} on {lease.lock_name}: last registered job is {current.get('job')!r} "
                                         f"({current.get('owner')}), expected one of {sorted(predecessors)}")
            if version is None:
                self.client.create_async(path, record, makepath=True).get(timeout=OP_TIMEOUT_S)
            else:
                self.client.set_async(path, record, version=version).get(timeout=OP_TIMEOUT_S)
        except (BadVersionError, NodeExistsError) as e:
            raise CoordinationGaveUp(f"{job_name} on {lease.lock_name}: predecessor changed concurrently") from e
        except (KazooException, KazooTimeoutError) as e:
            raise CoordinationGaveUp(f"{job_name} on {lease.lock_name}: ZooKeeper error {type(e).__name__}") from e

    # ---- one batch ------------------------------------------------------------------------------

    @contextmanager
    def batch(self, job: JobSpec, owner: str, timeout_s: float) -> Iterator[Lease]:
        """lock -> register -> yield the lease -> unlock (also on error, and when register gives up)."""
        lease = self.lock(job.lock_name, owner, timeout_s)
        try:
            self.register(lease, job.job_name, job.predecessors)
            yield lease
        finally:
            self.unlock(lease)
