"""Demo traffic for the profile CDC lake: hot-store changes of a few tenants on `profile.cdc`, and a
snapshot export to try the backfill with.

Changes are partial upserts (a few keys, sometimes an explicit null), links between ids of one
tenant (so identity components grow and join), about 2% deletes, 1% of changes sent late (an older
sequence after a newer one) and 1% bad records (not JSON, no id, unknown op, fields not an object).
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

COUNTRIES = ["DE", "FR", "US", "JP", "BR", "IN"]
PLANS = ["free", "trial", "pro", "enterprise"]


class ProfileCdcGenerator:
    def __init__(self, seed: int = 7, tenants: int = 3, ids_per_tenant: int = 400, bad_ratio: float = 0.01):
        self.rng = random.Random(seed)
        self.tenants = [f"tenant{i:02d}" for i in range(1, tenants + 1)]
        self.ids = ids_per_tenant
        self.bad_ratio = bad_ratio
        self.seq = {t: 0 for t in self.tenants}  # the hot store's per-tenant change sequence
        self.held: list[dict] = []  # changes delayed to arrive after newer ones

    def _fields(self, pid: str) -> dict:
        rng = self.rng
        pick = {
            "email": lambda: f"user{pid}@example.com",
            "country": lambda: rng.choice(COUNTRIES),
            "plan": lambda: rng.choice(PLANS),
            "score": lambda: rng.randint(0, 100),
            "tags": lambda: rng.sample(["photo", "video", "pdf", "3d", "fonts"], rng.randint(0, 3)),
            "address": lambda: {
                "city": rng.choice(["Berlin", "Paris", "Austin"]),
                "zip": str(rng.randint(10000, 99999)),
            },
        }
        keys = rng.sample(list(pick), rng.randint(1, 3))
        fields = {k: pick[k]() for k in keys}
        if rng.random() < 0.1:
            fields["plan"] = None  # "not captured": keeps the old value
        return fields

    def change(self, now: datetime) -> dict:
        rng = self.rng
        tenant = rng.choice(self.tenants)
        self.seq[tenant] += 1
        pid = str(rng.randint(1, self.ids))
        record = {
            "tenant": tenant,
            "primary_id": pid,
            "record_type": "person",
            "op": "upsert",
            "cdc_seq": self.seq[tenant],
            "cdc_ts": now.isoformat().replace("+00:00", "Z"),
        }
        if rng.random() < 0.02:
            record["op"] = "delete"
        else:
            record["fields"] = self._fields(pid)
            if rng.random() < 0.15:
                record["related_ids"] = [str(rng.randint(1, self.ids)) for _ in range(rng.randint(1, 2))]
        return record

    def message(self, now: datetime | None = None) -> tuple[bytes, bytes]:
        """(key, value) of the next message."""
        now = now or datetime.now(UTC)
        if self.rng.random() < self.bad_ratio:
            return b"bad", self.rng.choice(
                [
                    b'{"tenant": "tenant01", "primary_id": ',
                    b'{"tenant": "tenant01", "op": "upsert"}',
                    json.dumps(
                        {
                            "tenant": "tenant01",
                            "primary_id": "1",
                            "record_type": "person",
                            "op": "merge",
                            "cdc_seq": 1,
                            "cdc_ts": now.isoformat(),
                        }
                    ).encode(),
                    json.dumps(
                        {
                            "tenant": "tenant02",
                            "primary_id": "1",
                            "record_type": "person",
                            "op": "upsert",
                            "cdc_seq": 1,
                            "cdc_ts": now.isoformat(),
                            "fields": "[1, 2]",
                        }
                    ).encode(),
                ]
            )
        record = self.change(now)
        if self.rng.random() < 0.01:
            self.held.append(record)  # sent later, after newer changes of its tenant
            record = self.change(now)
        elif self.held and self.rng.random() < 0.2:
            record = self.held.pop(0)
        return f"{record['tenant']}/{record['primary_id']}".encode(), json.dumps(record).encode()


def write_snapshot_export(
    folder: str | Path, tenant: str = "tenant01", rows: int = 200, seed: int = 11, as_of: datetime | None = None
) -> Path:
    """A small hot-store export of `tenant` (JSON lines, one full profile per line, sequences below the
    demo stream's, timestamps an hour before `as_of`), for `engagement-platform profile-backfill`."""
    rng = random.Random(seed)
    gen = ProfileCdcGenerator(seed=seed)
    as_of = as_of or datetime.now(UTC)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(1, rows + 1):
        fields = {k: v for k, v in gen._fields(str(i)).items() if v is not None}
        row = {
            "tenant": tenant,
            "primary_id": str(i),
            "record_type": "person",
            "cdc_seq": 0,
            "cdc_ts": (as_of - timedelta(hours=1, seconds=rows - i)).isoformat().replace("+00:00", "Z"),
            "fields": fields,
        }
        if rng.random() < 0.1:
            row["related_ids"] = [str(rng.randint(1, rows))]
        lines.append(json.dumps(row))
    lines.append('{"tenant": "tenant01", "primary_id": ')  # one bad row: quarantined with file:line
    path = folder / f"{tenant}-snapshot.jsonl"
    tmp = folder / f".{path.name}"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(path)  # complete when visible
    return path
