"""ZooKeeper's side of status: who holds a lock (the owner, host and pid its holder wrote, and the run whose
liveness node names that host and pid), and the last job registered under it (the predecessor record).

Read-only: a lock node that does not exist is not asked for its contenders (kazoo's recipe would create it),
and the clock node the coordinator writes to read ZooKeeper's time is never touched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from engagement_platform.settings import Settings
from engagement_platform.status.report import COORDINATOR_OFF, UNAVAILABLE, Lock, Service, why
from engagement_platform.streams.coordinator import CoordinationGaveUp, Coordinator

ZOOKEEPER_TIMEOUT_S = 3.0


class ZooKeeperProbe:
    """Lock holders, predecessor records and run liveness nodes, read on one session, opened on the first
    question (a command about streams without a lock never asks ZooKeeper) and closed by `session`."""

    def __init__(self, settings: Settings):
        self.settings, self.asked = settings, False
        self.zk: Coordinator | None = None
        self.error: str | None = None
        self.locks: dict[str, Lock | str] = {}
        self.runs: dict[tuple[str | None, int | None], str] | None = None  # (host, pid) -> run id: liveness nodes

    @property
    def service(self) -> Service:
        where = f"{self.settings.zookeeper_hosts}{self.settings.zookeeper_root}"
        if not self.settings.coordinator_enabled:
            return Service("zookeeper", None, "EP_COORDINATOR=off")
        return Service("zookeeper", self.error is None if self.asked else None, self.error or where)

    @contextmanager
    def session(self) -> Iterator[ZooKeeperProbe]:
        # kazoo logs every refused connection; the report says once that ZooKeeper did not answer.
        quiet = logging.getLogger("kazoo.client")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            yield self
        finally:
            if self.zk is not None:
                self.zk.close()
            quiet.setLevel(level)

    def _connected(self) -> Coordinator | None:
        if not self.asked:
            self.asked = True
            zk = Coordinator(
                self.settings.zookeeper_hosts, self.settings.zookeeper_root, auth=self.settings.zookeeper_auth
            )
            try:
                zk.start(ZOOKEEPER_TIMEOUT_S)
                self.zk = zk
            except CoordinationGaveUp as e:
                self.error = str(e)
        return self.zk

    def lock(self, name: str) -> Lock | str:
        if not self.settings.coordinator_enabled:
            return COORDINATOR_OFF
        if name not in self.locks:
            zk = self._connected()
            if zk is None:
                return UNAVAILABLE
            try:
                self.locks[name] = self._read(zk, name)
            except (CoordinationGaveUp, KazooException, KazooTimeoutError) as e:
                self.error, self.zk = why(e), None
                zk.close()
                return UNAVAILABLE
        return self.locks[name]

    def _read(self, zk: Coordinator, name: str) -> Lock:
        # Asked only of a lock that exists: kazoo's recipe creates a missing lock node when asked for its contenders.
        exists = zk.client.exists(f"{zk.root}/locks/{name}") is not None
        holder = zk.holder(name) if exists else None  # None also when ZooKeeper did not answer: `connected` says
        record, _ = zk.registration(name)
        if not zk.client.connected:
            raise CoordinationGaveUp("the ZooKeeper session was lost while reading")
        last = f"{record.get('job')} ({record.get('owner')}, at {record.get('at')})" if record else None
        if holder is None:
            return Lock(name, last_registered=last)
        identity = parse_identity(holder)
        host, pid = identity.get("host"), identity.get("pid")
        run_id = self._run_ids(zk).get((host, pid)) if host and isinstance(pid, int) else None
        return Lock(name, str(identity.get("owner") or holder), host, pid, run_id, last)

    def _run_ids(self, zk: Coordinator) -> dict[tuple[str | None, int | None], str]:
        if self.runs is None:
            self.runs = {}
            for run_id in zk.live_runs():
                try:
                    data, _ = zk.client.get(zk.run_path(run_id))
                except NoNodeError:
                    continue  # its run ended meanwhile
                info = json.loads(data) if data else {}
                self.runs[(info.get("host"), info.get("pid"))] = run_id
        return self.runs


def parse_identity(holder: str) -> dict:
    """A lock contender's identity (JSON {owner, host, pid} written by Coordinator.lock), or {owner: it}."""
    try:
        parsed = json.loads(holder)
    except ValueError:
        return {"owner": holder}
    return parsed if isinstance(parsed, dict) else {"owner": holder}
