"""Realistic engagement activity traffic for demos and benchmarks (deterministic for a seed).

A few orgs with sales reps working cadences of email, call and meeting steps on leads and contacts;
a small share of bad records of every kind the ingestion stream must quarantine.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

from engagement_platform.engagement.tables import CALL_OUTCOMES

SUBJECTS = (
    "Quick question about {co}",
    "Following up",
    "Ideas for {co}'s Q3 pipeline",
    "Can we find 15 minutes?",
    "Re: pricing",
    "Intro from a mutual contact",
    "Last note from me",
)
STEP_WEIGHTS = {
    "email_sent": 40,
    "email_opened": 25,
    "email_clicked": 6,
    "email_replied": 4,
    "email_bounced": 2,
    "call": 14,
    "meeting": 3,
    "video_viewed": 3,
    "linkedin_message": 2,
    "task_completed": 1,
}
BAD_KINDS = ("not_json", "not_object", "missing_field", "wrong_type", "unknown_activity_type", "oversized")


class ActivityGenerator:
    def __init__(
        self,
        seed: int = 7,
        orgs: int = 20,
        start: datetime | None = None,
        bad_ratio: float = 0.01,
        id_prefix: str = "e",
    ):
        self.rng = random.Random(seed)
        self.orgs = [f"00D{n:06d}" for n in range(orgs)]
        self.bad_ratio = bad_ratio
        self.clock = start or datetime(2026, 1, 5, 8, tzinfo=UTC)
        self.sequence = 0
        # The seed is part of every id: a producer restarted with another seed (the CLI seeds with the
        # clock) does not re-send the ids an earlier run wrote to the same lake.
        self.id_prefix = f"{id_prefix}{seed:x}-"
        self.types, self.weights = zip(*STEP_WEIGHTS.items())

    def activity(self) -> dict:
        rng = self.rng
        self.sequence += 1
        self.clock += timedelta(seconds=rng.randint(1, 90))
        org = rng.choice(self.orgs)
        kind = rng.choices(self.types, self.weights)[0]
        on_lead = rng.random() < 0.6
        record = {
            "engagement_id": f"{self.id_prefix}{self.sequence:09d}",
            "org_id": org,
            "activity_type": kind,
            "event_time": self.clock.isoformat().replace("+00:00", "Z"),
            "user_id": f"005{rng.randint(0, 49):06d}",
            "lead_id": f"00Q{rng.randint(0, 4999):06d}" if on_lead else None,
            "contact_id": None if on_lead else f"003{rng.randint(0, 4999):06d}",
            "account_id": None if on_lead else f"001{rng.randint(0, 999):06d}",
            "cadence_id": f"cad{rng.randint(0, 29):03d}",
            "template_id": f"tpl{rng.randint(0, 99):03d}" if kind.startswith("email") else None,
            "subject": rng.choice(SUBJECTS).format(co=f"Acme {rng.randint(1, 500)}")
            if kind.startswith("email")
            else None,
            "payload": {"step": rng.randint(1, 8), "channel": "web" if rng.random() < 0.7 else "mobile"},
        }
        if kind == "call":
            record["call_outcome"] = rng.choice(CALL_OUTCOMES)
            record["duration_seconds"] = rng.randint(0, 1800)
        if kind == "meeting":
            record["duration_seconds"] = rng.choice((900, 1800, 3600))
        return record

    def bad_record(self) -> bytes:
        kind = self.rng.choice(BAD_KINDS)
        good = self.activity()
        if kind == "not_json":
            return json.dumps(good).encode()[:-7]
        if kind == "not_object":
            return json.dumps([good]).encode()
        if kind == "missing_field":
            good.pop(self.rng.choice(("org_id", "engagement_id", "activity_type", "event_time")))
        elif kind == "wrong_type":
            good["event_time"] = "yesterday"
        elif kind == "unknown_activity_type":
            good["activity_type"] = "fax_sent"
        elif kind == "oversized":
            good["payload"] = {"body": "x" * 70_000}
        return json.dumps(good).encode()

    def message(self) -> tuple[bytes, bytes]:
        """(key, value); keyed by org so one org's activities stay in order within a partition."""
        if self.rng.random() < self.bad_ratio:
            return b"bad", self.bad_record()
        record = self.activity()
        return record["org_id"].encode(), json.dumps(record, separators=(",", ":")).encode()


class _AboutRecentActivities:
    """A request generator's memory: the activities produced lately (a bounded window), which its
    requests are about, and a request counter."""

    WINDOW, TRIM = 5000, 1000  # keep at most WINDOW activities, dropping the TRIM oldest at a time

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.seen: list[dict] = []
        self.sequence = 0

    def observe(self, record: dict) -> None:
        self.seen.append(record)
        if len(self.seen) > self.WINDOW:
            del self.seen[: self.TRIM]


class MutationGenerator(_AboutRecentActivities):
    """ID mutation requests about activities already produced: leads converted to contacts, contacts
    merged, single engagements deleted; sometimes a chain (a converted contact merged again)."""

    def __init__(self, seed: int = 11):
        super().__init__(seed)
        self.converted: list[tuple[str, str]] = []  # (org, contact id made by a convert)

    def request(self, at: datetime) -> dict | None:
        if not self.seen:
            return None
        self.sequence += 1
        rng, base = (
            self.rng,
            {
                "request_id": f"m{at:%Y%m%d%H%M%S}-{self.sequence}",
                "request_time": at.isoformat().replace("+00:00", "Z"),
            },
        )
        record = rng.choice(self.seen)
        roll = rng.random()
        if roll < 0.2 and self.converted:  # chain: a contact made by an earlier convert is merged away
            org, contact = rng.choice(self.converted)
            return {
                **base,
                "org_id": org,
                "op": "merge",
                "field": "contact_id",
                "from_ids": [contact],
                "to_id": f"003M{self.sequence:07d}",
            }
        if roll < 0.7 and record.get("lead_id"):
            contact = f"003C{self.sequence:07d}"
            self.converted.append((record["org_id"], contact))
            return {
                **base,
                "org_id": record["org_id"],
                "op": "convert",
                "from_field": "lead_id",
                "from_id": record["lead_id"],
                "to_field": "contact_id",
                "to_id": contact,
            }
        return {**base, "org_id": record["org_id"], "op": "delete", "engagement_id": record["engagement_id"]}


class GdprGenerator(_AboutRecentActivities):
    """TTL / GDPR requests about activities already produced: mostly the erasure of a lead or contact
    seen, sometimes an org's retention (delete engagements older than N days)."""

    def __init__(self, seed: int = 13, retention_days: tuple[int, ...] = (90, 180, 365)):
        super().__init__(seed)
        self.retention_days = retention_days

    def request(self, at: datetime) -> dict | None:
        if not self.seen:
            return None
        self.sequence += 1
        record = self.rng.choice(self.seen)
        base = {
            "request_id": f"g{at:%Y%m%d%H%M%S}-{self.sequence}",
            "org_id": record["org_id"],
            "request_time": at.isoformat().replace("+00:00", "Z"),
        }
        if self.rng.random() < 0.2:
            return {**base, "kind": "retention", "retention_days": self.rng.choice(self.retention_days)}
        return {**base, "kind": "erasure", "subject_id": record.get("lead_id") or record["contact_id"]}
