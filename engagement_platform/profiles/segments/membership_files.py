"""Where a tenant's membership is stored: its base files, its log files, and the batch the base is compacted
through, at given versions of the two tables, each version loaded once for every tenant.

A log file holds one batch of one tenant (evaluations write a file per tenant and batch; erasure rewrites a
file without some rows), so its `batch_id` statistics say whether the base has already folded it in: those
files are skipped, and only the log written since the last compaction is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from engagement_platform.lake.delta import DeltaLake
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS


def compaction_app_id(tenant: str) -> str:
    """The txn app id of a tenant's compactions in the base: its version is the batch the base is folded through."""
    return f"profile.segments.compaction/{tenant}"


@dataclass(frozen=True)
class TenantFiles:
    base: tuple[str, ...]  # file URIs of the tenant's base
    log: tuple[str, ...]  # of its log files holding batches after `through`
    through: int  # the last batch the base folds in (-1: never compacted)
    log_rows: int  # rows in `log`, from the files' statistics


class MembershipFiles:
    """Tenants' membership files at versions of the base and the log (None: the current one)."""

    def __init__(self, lake: DeltaLake):
        self.lake = lake
        self._loaded: dict[tuple[str, int | None], tuple[DeltaTable | None, dict[str, list[tuple[str, int, int]]]]] = {}

    def _load(self, name: str, version: int | None) -> tuple[DeltaTable | None, dict[str, list[tuple[str, int, int]]]]:
        """(the table, tenant -> [(file URI, highest batch_id or -1 when unknown, rows)])."""
        if (name, version) not in self._loaded:
            if (version is not None and version < 0) or not self.lake.exists(name):
                self._loaded[(name, version)] = (None, {})
            else:
                table = self.lake.table(name, version)
                actions = pa.table(table.get_add_actions(flatten=True))
                root = self.lake.uri(name).rstrip("/")
                top = actions["max.batch_id"].to_pylist() if "max.batch_id" in actions.column_names else None
                rows = actions["num_records"].to_pylist() if "num_records" in actions.column_names else None
                by_tenant: dict[str, list[tuple[str, int, int]]] = {}
                for i, (path, tenant) in enumerate(
                    zip(actions["path"].to_pylist(), actions["partition.tenant"].to_pylist())
                ):
                    highest = top[i] if top is not None and top[i] is not None else -1
                    by_tenant.setdefault(tenant, []).append(
                        (f"{root}/{unquote(path)}", highest, (rows[i] or 0) if rows is not None else 0)
                    )
                self._loaded[(name, version)] = (table, by_tenant)
        return self._loaded[(name, version)]

    def load(self, base_version: int | None = None, log_version: int | None = None) -> None:
        """Load both tables at these versions now (before several threads share this object)."""
        self._load(PROFILE_SEGMENTS.name, base_version)
        self._load(PROFILE_SEGMENT_CHANGES.name, log_version)

    def through(self, tenant: str, base_version: int | None = None) -> int:
        table, _ = self._load(PROFILE_SEGMENTS.name, base_version)
        version = table.transaction_version(compaction_app_id(tenant)) if table is not None else None
        return -1 if version is None else version

    def log_after(self, tenant: str, after: int, log_version: int | None = None) -> tuple[str, ...]:
        """The tenant's log files that may hold batches after `after` (all of them for -1)."""
        _, log = self._load(PROFILE_SEGMENT_CHANGES.name, log_version)
        return tuple(uri for uri, highest, _ in log.get(tenant, []) if highest < 0 or highest > after)

    def all_log(self, tenant: str, log_version: int | None = None) -> tuple[str, ...]:
        return self.log_after(tenant, -1, log_version)

    def newest_logged(self, tenant: str, log_version: int | None = None) -> int:
        """The newest batch in the tenant's log (-1: none), from the files' statistics."""
        _, log = self._load(PROFILE_SEGMENT_CHANGES.name, log_version)
        return max([-1, *(highest for _, highest, _ in log.get(tenant, []))])

    def highest_batch(self, tenant: str, base_version: int | None = None, log_version: int | None = None) -> int:
        """The newest batch the tenant's log holds after its base's point (the point itself when none)."""
        through = self.through(tenant, base_version)
        _, log = self._load(PROFILE_SEGMENT_CHANGES.name, log_version)
        return max([through, *(highest for _, highest, _ in log.get(tenant, []))])

    def of(self, tenant: str, base_version: int | None = None, log_version: int | None = None) -> TenantFiles:
        through = self.through(tenant, base_version)
        _, base = self._load(PROFILE_SEGMENTS.name, base_version)
        _, log = self._load(PROFILE_SEGMENT_CHANGES.name, log_version)
        # a file without statistics (-1) is read; its rows of batches up to `through` are dropped as they are read
        newer = [(uri, rows) for uri, highest, rows in log.get(tenant, []) if highest < 0 or highest > through]
        return TenantFiles(
            tuple(uri for uri, _, _ in base.get(tenant, [])),
            tuple(uri for uri, _ in newer),
            through,
            sum(rows for _, rows in newer),
        )
