"""Job coordinator over ZooKeeper (kazoo): one lock per shared resource, a predecessor CAS, fencing.

The workflow per micro-batch of Salesforce's "Global Synchronousness and Ordering in Delta Lake": lock the
shared resource (e.g. the engagement_activity table) or give up after a timeout; check that the last job registered on that lock is an allowed
predecessor and register this job (compare-and-swap on the znode version) or give up and release;
process and commit; release. A give-up commits nothing: the batch is retried on a later tick from
its stored plan.

The predecessor wait is bounded (`JobSpec.max_predecessor_wait_s`): a last registered job that is
not an allowed predecessor stops blocking once it registered that long ago, by ZooKeeper's clock.
Waiting one's turn for the lock may also be long: `wait_for_lock` keeps waiting, in rounds of the
lock timeout, up to a longer bound (`patience_s`), calling back after each round.

ZooKeeper layout under `root`:
    locks/<lock_name>/<uuid>__lock__<seq>   kazoo's Lock recipe: ephemeral sequential, lowest holds it
    predecessors/<lock_name>                JSON {job, owner, token, at}: the last registered job; its
                                            mtime (ZooKeeper's clock) is when it registered
    clock                                   written to read ZooKeeper's current time (its mtime)
    runs/<run_id>                           ephemeral, JSON {host, pid, started_at, run tags}: the run's
                                            process is alive (its session holds the node; a crash or a
                                            kill ends the session, and ZooKeeper deletes the node)

Fencing: the lock znode's sequence number is the lease's token; it only grows per lock. A writer
calls `Lease.check()` right before each commit (LeaseLost once the session is lost, was replaced after
expiry, or the znode is gone, or the connection stays down for `reconnect_wait_s`; a shorter outage, e.g. a
server restart, is waited out) and writes the token into the commit's metadata.

Run liveness (`register_run`, `live_runs`): any process can tell whether a run's process still exists,
whatever launched it. The node lives on the same session as the run's leases, so a run that lost its
lease has also, for the time of the outage, no proof of life; the node is re-created on every new session.

Long by design: the lock, the predecessor rule and run liveness share one session and its reconnect handling.

Retries of the same batch: `owner` names the batch (e.g. "mutation/7"), not the process. A batch
that registered and then crashed finds its own record on the predecessor znode when it is retried;
`register` accepts that record (same job, same owner) whatever the predecessor set says, so a batch
is never blocked by its own earlier registration.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeGuard

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, LockTimeout, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

OP_TIMEOUT_S = 5.0  # upper bound for one ZooKeeper round trip we wait on (check, unlock, register)


@dataclass(frozen=True)
class JobSpec:
    """One stream's coordination config."""

    lock_name: str  # the shared resource, e.g. "engagement_activity"
    job_name: str  # e.g. "ingestion"
    predecessors: frozenset[str] = frozenset()  # allowed last-registered jobs; empty = any
    # Seconds after which any last-registered job counts as an allowed predecessor; None = wait forever.
    max_predecessor_wait_s: float | None = None


class CoordinationGaveUp(Exception):
    """Lock timeout, predecessor mismatch or ZooKeeper unreachable: nothing committed, retry next tick."""


class PredecessorRefused(CoordinationGaveUp):
    """The predecessor rule refused the batch; `wait_s`: seconds until its bounded wait ends (None: unbounded)."""

    def __init__(self, message: str, wait_s: float | None = None):  # defaults: picklable
        super().__init__(message)
        self.wait_s = wait_s


class LockBusy(CoordinationGaveUp):
    """The lock stayed held by someone else for the whole timeout while ZooKeeper answered: the
    batch's turn has not come yet (as opposed to ZooKeeper being away or the rule forbidding it)."""

    def __init__(self, message: str, lock_name: str = "", holder: str | None = None):  # defaults: picklable
        super().__init__(message)
        self.lock_name, self.holder = lock_name, holder


class LeaseLost(Exception):
    """The lock is no longer held (session lost, expired or znode gone): the writer must not commit."""


class Lease:
    """A held lock. `token` is the lock znode's sequence number (the fencing token)."""

    def __init__(self, coordinator: Coordinator, lock_name: str, owner: str, token: int, path: str, session_id: int):
        self._coordinator = coordinator
        self.lock_name, self.owner, self.token = lock_name, owner, token
        self.path, self.session_id = path, session_id
        self.waited_s = 0.0  # seconds spent waiting for the lock before it was obtained (set by wait_for_lock)

    @property
    def coordinator(self) -> Coordinator:
        """The coordinator whose ZooKeeper session holds the lock."""
        return self._coordinator

    def check(self) -> None:
        """Raise LeaseLost unless the session is connected and our znode is still the lock holder."""
        self._coordinator._check(self)

    def __repr__(self) -> str:
        return f"Lease({self.lock_name!r}, owner={self.owner!r}, token={self.token})"


def allowed(
    current: dict | None,
    job_name: str,
    owner: str,
    predecessors: frozenset[str],
    registered_s_ago: float | None = None,
    max_wait_s: float | None = None,
) -> bool:
    """The predecessor rule (pure): nobody registered yet, a retry of the same batch, any job when
    the set is empty, the last registered job in the set, or (bounded wait) any last registered job
    once it registered at least `max_wait_s` ago.

    The bound exists for liveness: the allowed predecessors have not registered for that long, so
    they are idle, and waiting longer cannot bring the order the rule exists for (a job between the
    two); it would only hold this batch back until something unrelated happens to run."""
    if not current:
        return True
    if current.get("job") == job_name and current.get("owner") == owner:
        return True
    if not predecessors or current.get("job") in predecessors:
        return True
    return registered_s_ago is not None and max_wait_s is not None and registered_s_ago >= max_wait_s


def is_bounded(max_wait_s: float | None) -> TypeGuard[float]:
    """A finite predecessor wait (None or infinity: wait for an allowed predecessor, however long)."""
    return max_wait_s is not None and math.isfinite(max_wait_s)


def wait_ends(registered_s_ago: float | None, max_wait_s: float | None) -> str:
    """When a bounded predecessor wait ends, for give-up messages and sensor skip reasons ("" if unbounded)."""
    if registered_s_ago is None or not is_bounded(max_wait_s):
        return ""
    return f"; it registered {registered_s_ago:.0f}s ago, so the wait ends in {max(max_wait_s - registered_s_ago, 0):.0f}s (bound {max_wait_s:g}s)"


def process_started_at() -> float:
    """This process's start time (epoch seconds) from /proc on Linux; elsewhere, now."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/stat") as system:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks after boot
            boot = next(int(line.split()[1]) for line in system if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def run_liveness_info(run_id: str, labels: dict[str, str]) -> dict:
    """What a run's liveness node says about it: host, process, when the process started, and `labels`
    (stream, batch or partition) so a person reading ZooKeeper knows which run it is."""
    return {
        "run_id": run_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_started_at": round(process_started_at(), 3),
        "registered_at": datetime.now(UTC).isoformat(),
        **labels,
    }


def secured(auth: str | None) -> dict:
    """KazooClient arguments for digest authentication ("user:password", EP_ZK_AUTH): the session
    authenticates, and every node it creates is readable and writable by that identity only, so a client
    without the credentials can neither take nor delete a lock, nor read or change a registration or a
    fencing token. Nodes created before auth was set keep their (open) ACL."""
    if not auth:
        return {}
    user, sep, password = auth.partition(":")
    if not sep or not user:
        raise ValueError("EP_ZK_AUTH must be 'user:password'")
    return {"auth_data": [("digest", auth)], "default_acl": [make_digest_acl(user, password, all=True)]}


class Coordinator:
    def __init__(
        self,
        hosts: str,
        root: str = "/engagement_platform",
        session_timeout_s: float = 10.0,
        auth: str | None = None,
        reconnect_wait_s: float = 60.0,
    ):
        self.hosts, self.root = hosts, "/" + root.strip("/")
        self.session_timeout_s = session_timeout_s
        # How long a lease check waits for a suspended connection to come back. Never less than the session
        # timeout: a session can come back at any point within it, so giving up sooner fails leases that hold.
        self.reconnect_wait_s = max(reconnect_wait_s, session_timeout_s)
        # Reconnect quickly after a server restart (default backoff grows to a minute).
        self.client = KazooClient(
            hosts=hosts,
            timeout=session_timeout_s,
            connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
            **secured(auth),
        )
        self._stale: set[tuple[str, int]] = set()  # lock znodes an unlock could not delete (server away)
        self._started = False  # once started, kazoo reconnects by itself: never restart a suspended client
        self._runs: dict[str, bytes] = {}  # run id -> liveness data this session holds (re-created on a new session)

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
        deadline = time.monotonic() + timeout_s
        # A server restarting (a few seconds) is waited for within the lock's own bound, not given up on at once.
        self.start(timeout_s=max(timeout_s, 0.5))
        while not self.client.connected:  # reconnecting after a server restart: kazoo retries by itself
            if time.monotonic() >= deadline:
                raise CoordinationGaveUp(
                    f"lock {lock_name}: ZooKeeper {self.hosts} not reconnected within {timeout_s:g}s"
                )
            time.sleep(0.05)
        self._sweep_stale()  # our own lock znodes an unlock could not delete while the server was away
        identity = json.dumps({"owner": owner, "host": socket.gethostname(), "pid": os.getpid()})
        recipe = self.client.Lock(f"{self.root}/locks/{lock_name}", identifier=identity)
        # kazoo's recipe makes blocking calls, which wait for as long as the server is away: past the
        # deadline, drop the session (our znode goes with it) so they fail and we can give up.
        watchdog = threading.Timer(max(deadline - time.monotonic(), 0.0) + OP_TIMEOUT_S, self._abandon_if_disconnected)
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
            if not self.client.connected:
                raise CoordinationGaveUp(
                    f"lock {lock_name} not obtained within {timeout_s:g}s (held by unknown: ZooKeeper unreachable)"
                )
            holder = self.holder(lock_name)
            raise LockBusy(f"lock {lock_name} not obtained within {timeout_s:g}s (held by {holder})", lock_name, holder)
        path = f"{recipe.path}/{recipe.node}"
        lease = Lease(self, lock_name, owner, int(recipe.node[-10:]), path, self._session_id() or 0)
        try:
            unsure = self._check_once(lease)  # once: the lock's bound is spent, do not wait out a suspension here
            if unsure is not None:
                raise LeaseLost(f"{lease}: {unsure}")
        except LeaseLost as e:  # the session changed between acquire and now
            self.unlock(lease)
            raise CoordinationGaveUp(str(e)) from e
        return lease

    def wait_for_lock(
        self,
        lock_name: str,
        owner: str,
        timeout_s: float,
        patience_s: float | None = None,
        on_wait: Callable[[LockBusy, float], None] | None = None,
    ) -> Lease:
        """`lock` in rounds of `timeout_s` while the lock is busy (LockBusy), up to `patience_s` in all
        (default: one round), calling `on_wait(busy, seconds waited so far)` after each round; then the
        last LockBusy, naming the whole wait. Other give-ups (ZooKeeper away) end the wait at once.
        A new round queues behind contenders that arrived meanwhile; rounds keep the per-round
        ZooKeeper watchdog of `lock`, and let the caller report progress from its own thread."""
        started = time.monotonic()
        deadline = started + max(patience_s or 0.0, timeout_s)
        while True:
            remaining = deadline - time.monotonic()
            try:
                lease = self.lock(lock_name, owner, min(timeout_s, remaining))
            except LockBusy as busy:
                waited = time.monotonic() - started
                if deadline - time.monotonic() < 0.05:
                    raise LockBusy(
                        f"lock {lock_name} not obtained within {round(waited, 1):g}s (held by {busy.holder})",
                        lock_name,
                        busy.holder,
                    ) from busy
                if on_wait is not None:
                    on_wait(busy, waited)
                continue
            lease.waited_s = time.monotonic() - started
            return lease

    def holder(self, lock_name: str) -> str | None:
        """Identity (JSON) written by the current lock holder, for messages; None if free or unknown."""
        try:
            recipe = self.client.Lock(f"{self.root}/locks/{lock_name}")
            contenders = recipe.contenders()
        except KazooException:
            return None
        return contenders[0] if contenders else None

    def check_leases(self, leases: list[Lease]) -> None:
        """Every one of this session's leases holds, or LeaseLost, with one round trip for all of them (their
        existence questions sent together), so a run holding many tenants' locks pays one. A connection that is
        only suspended (a server restart, a network blip) is waited out up to `reconnect_wait_s`: while the
        session lives, ZooKeeper keeps our lock znodes and nobody else can hold the locks, so the same session back
        with the znodes still ours proves the leases as well as an unbroken connection does. The wait may outlast
        the session timeout: a server that restarts restores its sessions and gives each a full timeout again
        from its start (without the wait, restarts longer than the 10 s session fail runs whose session comes
        back), while a session the server did expire is reported as LOST on reconnection. A lost or replaced
        session, or a znode that is gone, ends the wait at once."""
        deadline = time.monotonic() + self.reconnect_wait_s
        while True:
            unsure = self._check_many_once(leases)
            if unsure is None:
                return
            if time.monotonic() >= deadline:
                raise LeaseLost(f"{leases[0]}: {unsure} for {self.reconnect_wait_s:g}s")
            time.sleep(0.05)

    def _check_many_once(self, leases: list[Lease]) -> str | None:
        """None: every lease holds. A reason to ask again (not connected now, no answer); LeaseLost: one is gone.
        The znode questions are in flight together."""
        client = self.client
        if client.state == KazooState.LOST:
            raise LeaseLost(f"{leases[0]}: ZooKeeper session lost")
        if client.state != KazooState.CONNECTED:
            return f"ZooKeeper session {client.state.lower()}"
        session = self._session_id()
        for lease in leases:
            if session != lease.session_id:
                raise LeaseLost(f"{lease}: session {lease.session_id:#x} expired (now {session or 0:#x})")
        asked = [(lease, client.exists_async(lease.path)) for lease in leases]
        for lease, answer in asked:
            try:
                stat = answer.get(timeout=OP_TIMEOUT_S)
            except (KazooException, KazooTimeoutError) as e:
                return f"cannot verify the lock ({type(e).__name__})"
            if stat is None or stat.ephemeralOwner != lease.session_id:
                raise LeaseLost(f"{lease}: lock znode {lease.path} is gone")
        return None

    def _check(self, lease: Lease) -> None:
        """The lease holds, or LeaseLost (check_leases of one)."""
        self.check_leases([lease])

    def _check_once(self, lease: Lease) -> str | None:
        """None: the lease holds. A reason to ask again (not connected now, no answer); LeaseLost: it is gone."""
        return self._check_many_once([lease])

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
        return self.registration(lock_name)[0]

    def registration(self, lock_name: str) -> tuple[dict | None, int | None]:
        """The last registered job's record and its registration time (the znode's mtime: ms on
        ZooKeeper's clock); (None, None) if nobody registered yet."""
        try:
            data, stat = self.client.get(self.predecessor_path(lock_name))
        except NoNodeError:
            return None, None
        return (json.loads(data) if data else None), stat.mtime

    def pass_turn(self, lock_name: str, job_name: str, over: frozenset[str]) -> dict | None:
        """Register `job_name` as having run with nothing to do (owner "<job>/idle"), for a stream that found
        its topic fully committed: a job that may follow only it (an ID rewrite after fresh activities) need not
        wait for a batch that has nothing to bring. Only while the lock is free and the last registered job is
        one in `over` (those another job may not follow); a compare-and-swap on the znode's version, so a batch
        that registers meanwhile wins and this gives way. The record it replaced, or None when it wrote nothing."""
        if self.holder(lock_name) is not None:
            return None
        path = self.predecessor_path(lock_name)
        try:
            data, stat = self.client.get_async(path).get(timeout=OP_TIMEOUT_S)
        except NoNodeError:
            return None  # nobody registered yet: every job may start anyway
        current = json.loads(data) if data else None
        if not current or current.get("job") == job_name or current.get("job") not in over:
            return None
        record = {"job": job_name, "owner": f"{job_name}/idle", "token": None, "at": datetime.now(UTC).isoformat()}
        try:
            self.client.set_async(path, json.dumps(record).encode(), version=stat.version).get(timeout=OP_TIMEOUT_S)
        except BadVersionError:
            return None
        return dict(current)

    def server_time_ms(self) -> int:
        """ZooKeeper's current time (ms): the mtime of a write to `<root>/clock`. Registration times
        are mtimes too, so an age is measured on one clock (the ensemble leader's), whatever the
        clocks of the hosts running the streams say."""
        path = f"{self.root}/clock"
        try:
            stat = self.client.set_async(path, b"").get(timeout=OP_TIMEOUT_S)
        except NoNodeError:
            self.client.ensure_path_async(path).get(timeout=OP_TIMEOUT_S)
            stat = self.client.set_async(path, b"").get(timeout=OP_TIMEOUT_S)
        return stat.mtime

    def seconds_since(self, mtime_ms: int) -> float:
        return max(self.server_time_ms() - mtime_ms, 0) / 1000

    def register(
        self, lease: Lease, job_name: str, predecessors: frozenset[str], max_predecessor_wait_s: float | None = None
    ) -> None:
        """Register `job_name` as the last job on the lease's lock if the last registered job is an
        allowed predecessor (see `allowed`; its age only read when the set says no); a compare-and-swap
        on the znode's version, so a registration that raced ours (a fencing failure) makes this one give up."""
        lease.check()
        path = self.predecessor_path(lease.lock_name)
        record = json.dumps(
            {"job": job_name, "owner": lease.owner, "token": lease.token, "at": datetime.now(UTC).isoformat()}
        ).encode()
        try:
            try:
                data, stat = self.client.get_async(path).get(timeout=OP_TIMEOUT_S)
            except NoNodeError:
                current, version, mtime = None, None, None
            else:
                current, version, mtime = (json.loads(data) if data else None), stat.version, stat.mtime
            # Nobody registered yet (None) is allowed.
            if current is not None and not allowed(current, job_name, lease.owner, predecessors):
                # The age costs a write (ZooKeeper's clock), so it is read only when the set says no.
                age = self.seconds_since(mtime) if is_bounded(max_predecessor_wait_s) and mtime is not None else None
                if not allowed(current, job_name, lease.owner, predecessors, age, max_predecessor_wait_s):
                    remaining = (
                        max(max_predecessor_wait_s - age, 0.0)
                        if age is not None and max_predecessor_wait_s is not None
                        else None
                    )
                    raise PredecessorRefused(
                        f"{job_name} on {lease.lock_name}: last registered job is {current.get('job')!r} "
                        f"({current.get('owner')}), expected one of {sorted(predecessors)}"
                        f"{wait_ends(age, max_predecessor_wait_s)}",
                        remaining,
                    )
            if version is None:
                self.client.create_async(path, record, makepath=True).get(timeout=OP_TIMEOUT_S)
            else:
                self.client.set_async(path, record, version=version).get(timeout=OP_TIMEOUT_S)
        except (BadVersionError, NodeExistsError) as e:
            raise CoordinationGaveUp(f"{job_name} on {lease.lock_name}: predecessor changed concurrently") from e
        except (KazooException, KazooTimeoutError) as e:
            raise CoordinationGaveUp(f"{job_name} on {lease.lock_name}: ZooKeeper error {type(e).__name__}") from e

    # ---- run liveness ---------------------------------------------------------------------------

    def run_path(self, run_id: str) -> str:
        return f"{self.root}/runs/{run_id}"

    def register_run(self, run_id: str, info: dict) -> bool:
        """Hold the ephemeral node runs/<run_id> (data: `info` as JSON) for as long as this session
        lives, and again on every later session of this client (after an expiry, or a restart by a
        lock watchdog). True once the node exists; False while ZooKeeper is not connected: the node is
        created when the session connects, which this call does not wait for."""
        if not self._runs:
            self.client.add_listener(self._on_state)
        self._runs[run_id] = json.dumps(info).encode()
        return self.client.connected and self._ensure_run_node(run_id)

    def start_in_background(self) -> None:
        """Open the session without waiting (kazoo keeps trying): for a process that only holds liveness."""
        if not self._started:
            self.client.start_async()
            self._started = True

    def unregister_run(self, run_id: str) -> None:
        """Delete the run's liveness node (closing the session deletes it as well)."""
        if self._runs.pop(run_id, None) is None or not self.client.connected:
            return
        try:
            self.client.delete_async(self.run_path(run_id)).get(timeout=OP_TIMEOUT_S)
        except (KazooException, KazooTimeoutError):
            pass  # gone already, or goes with the session

    def live_runs(self) -> frozenset[str]:
        """The ids of the runs whose liveness node exists now. KazooException or KazooTimeoutError when
        ZooKeeper does not answer: then nothing can be said about any run."""
        try:
            return frozenset(self.client.get_children_async(f"{self.root}/runs").get(timeout=OP_TIMEOUT_S))
        except NoNodeError:
            return frozenset()

    def _on_state(self, state: str) -> None:
        # Called on kazoo's connection thread, which must not block: create the nodes from another one.
        if state == KazooState.CONNECTED and self._runs:
            self.client.handler.spawn(self._ensure_run_nodes)

    def _ensure_run_nodes(self) -> None:
        for run_id in list(self._runs):
            self._ensure_run_node(run_id)

    def _ensure_run_node(self, run_id: str) -> bool:
        data = self._runs.get(run_id)
        if data is None:
            return False
        path, session = self.run_path(run_id), self._session_id()
        try:
            stat = self.client.exists_async(path).get(timeout=OP_TIMEOUT_S)
            if stat is not None and stat.ephemeralOwner == session:
                return True
            if stat is not None:  # held by an earlier session of ours that the server has not expired yet
                self.client.delete_async(path).get(timeout=OP_TIMEOUT_S)
            self.client.create_async(path, data, ephemeral=True, makepath=True).get(timeout=OP_TIMEOUT_S)
            return True
        except NodeExistsError:
            return True  # created meanwhile by the listener's thread
        except (KazooException, KazooTimeoutError):
            return False  # not connected after all: the next CONNECTED creates it

    # ---- one batch ------------------------------------------------------------------------------

    @contextmanager
    def batch(
        self,
        job: JobSpec,
        owner: str,
        timeout_s: float,
        patience_s: float | None = None,
        on_lock_wait: Callable[[LockBusy, float], None] | None = None,
    ) -> Iterator[Lease]:
        """lock (`wait_for_lock`: rounds of `timeout_s` up to `patience_s`) -> register (with the job's
        bounded predecessor wait) -> yield the lease -> unlock (also on error, and when register gives up)."""
        lease = self.wait_for_lock(job.lock_name, owner, timeout_s, patience_s, on_lock_wait)
        try:
            self.register(lease, job.job_name, job.predecessors, job.max_predecessor_wait_s)
            yield lease
        finally:
            self.unlock(lease)
