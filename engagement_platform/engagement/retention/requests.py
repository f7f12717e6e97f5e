"""TTL / GDPR requests: their format, the driver-side checks, the retention cut-off and what an erasure
matches. Pure logic (no Spark, no Dagster, no I/O).

Requests (JSON, one per Kafka message on EP_GDPR_TOPIC, default `engagement.gdpr`):

    common     request_id (str), org_id (str), request_time (ISO timestamp), kind: retention | erasure
    retention  retention_days (int, 1..36500): delete the org's engagements older than that many days,
               i.e. engagement_date < cutoff = request_time's UTC date - retention_days. The cut-off
               comes from the request, never from the clock, so a re-run of a batch deletes the same
               rows. Rows with a null engagement_date are kept.
    erasure    subject_id (str): a lead or contact id. Every engagement of the org whose lead_id or
               contact_id is it, and every row of the other tables that mentions it (see `mentions`).
               The lake keeps only its keyed hash (lake/suppression.py): in the suppression list that
               makes every stream drop the subject's later records, and in gdpr_audit.

    {"request_id": "g1", "org_id": "00D000001", "request_time": "2026-02-01T00:00:00Z", "kind": "retention", "retention_days": 365}
    {"request_id": "g2", "org_id": "00D000001", "request_time": "2026-02-01T00:00:00Z", "kind": "erasure", "subject_id": "00Q000123"}

Raw content (quarantined records, request JSON) is matched by `mentions`: the subject id occurs as a
whole token, i.e. not directly preceded or followed by a letter, digit or underscore. Platform ids are
alphanumeric and JSON delimits values with quotes, so this finds the id in valid JSON, in truncated or
otherwise unparsable bytes, and in free text, without matching a longer id that merely contains it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

from engagement_platform.ingest.errors import VALIDATE
from engagement_platform.lake.delta import sql_literal

RETENTION, ERASURE = "retention", "erasure"
# engagement_activity columns that hold a person (lead or contact); account_id and user_id do not.
SUBJECT_FIELDS = ("lead_id", "contact_id")
# A request_time this far past the batch's as-of time is refused (its cut-off would be in the future).
FUTURE_TOLERANCE = timedelta(days=1)
CHECKS = "gdpr_request"  # plugin name of the driver-side request checks
REQUEST_KEYS = ("request_id", "org_id", "request_time", "kind", "retention_days", "subject_id")


@dataclass(frozen=True)
class RetentionRequest:
    request_id: str
    org_id: str
    request_time: datetime
    kind: str
    retention_days: int | None = None
    subject_id: str | None = None

    @property
    def order(self) -> tuple[datetime, str]:
        return self.request_time, self.request_id

    @property
    def cutoff(self) -> date | None:
        return cutoff_date(self.request_time, self.retention_days) if self.kind == RETENTION else None

    def to_json(self) -> dict:
        d = {
            "request_id": self.request_id,
            "org_id": self.org_id,
            "request_time": iso(self.request_time),
            "kind": self.kind,
        }
        if self.kind == RETENTION:
            d["retention_days"] = self.retention_days
        else:
            d["subject_id"] = self.subject_id
        return d


def cutoff_date(request_time: datetime, retention_days: int) -> date:
    """Rows with engagement_date < this are older than `retention_days` at the request's (UTC) day."""
    return utc(request_time).date() - timedelta(days=retention_days)


def utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def iso(value: datetime) -> str:
    return utc(value).isoformat().replace("+00:00", "Z")


def error(column: str | None, code: str, message: str, value: Any = None) -> dict:
    return {
        "stage": VALIDATE,
        "plugin": CHECKS,
        "column_name": column,
        "error_code": code,
        "message": message,
        "value": None if value is None else str(value),
    }


def canonical_request(row: dict, as_of: datetime) -> tuple[RetentionRequest | None, list[dict]]:
    """(request, driver-side errors) of a row the framework found valid (types already checked)."""
    d = {k: row.get(k) for k in REQUEST_KEYS}
    errors = []
    kind = d["kind"]
    needed, unwanted = ("retention_days", "subject_id") if kind == RETENTION else ("subject_id", "retention_days")
    value = d[needed]
    if value is None or (isinstance(value, str) and not value.strip()):
        errors.append(error(needed, "missing_required", f"kind '{kind}' requires '{needed}'"))
    if d[unwanted] is not None:
        errors.append(error(unwanted, "unexpected_field", f"kind '{kind}' does not take '{unwanted}'", d[unwanted]))
    for name in ("request_id", "org_id"):
        if not str(d[name]).strip():
            errors.append(error(name, "missing_required", f"'{name}' is blank"))
    at = utc(d["request_time"])
    if at > utc(as_of) + FUTURE_TOLERANCE:
        errors.append(
            error(
                "request_time",
                "request_time_in_future",
                f"request_time {iso(at)} is more than {FUTURE_TOLERANCE.days} day(s) after the batch time {iso(as_of)}",
                iso(at),
            )
        )
    if errors:
        return None, errors
    return RetentionRequest(
        d["request_id"],
        d["org_id"],
        at,
        kind,
        int(d["retention_days"]) if kind == RETENTION else None,
        d["subject_id"] if kind == ERASURE else None,
    ), []


@lru_cache(maxsize=4096)
def _token(subject_id: str) -> re.Pattern:
    return re.compile(rf"(?<![A-Za-z0-9_]){re.escape(subject_id)}(?![A-Za-z0-9_])")


def mentions(content: str | bytes | None, subject_id: str) -> bool:
    """Whether raw content holds `subject_id` as a whole token (module docstring)."""
    if content is None or not subject_id:
        return False
    if isinstance(content, (bytes, bytearray)):
        content = bytes(content).decode("utf-8", errors="replace")
    return _token(subject_id).search(content) is not None


def activity_request(row: dict, requests: list[RetentionRequest]) -> RetentionRequest | None:
    """The first request (in request order) of the row's org that removes this engagement_activity row."""
    for r in requests:
        if r.org_id != row["org_id"]:
            continue
        if r.kind == ERASURE and any(row.get(f) == r.subject_id for f in SUBJECT_FIELDS):
            return r
        if r.kind == RETENTION and row.get("engagement_date") is not None and row["engagement_date"] < r.cutoff:
            return r
    return None


def content_request(
    texts: list[str | bytes | None], org_id: str | None, erasures: list[RetentionRequest]
) -> RetentionRequest | None:
    """The first erasure whose subject the content mentions, among the row's org's erasures (all of
    them when the row has no org: a record that did not parse far enough to have one)."""
    for r in erasures:
        if (org_id is None or r.org_id == org_id) and any(mentions(t, r.subject_id) for t in texts):
            return r
    return None


def activity_predicate(requests: list[RetentionRequest], erased: dict[str, set[str]] | None = None) -> str | None:
    """One delete predicate for the whole batch, each org's terms under its partition value: retention by
    its cut-off, erasure by the keys (`erased`: org -> engagement ids) of the subjects' rows, never by the
    subject ids themselves, because Delta logs a delete's predicate in clear (issue: erasure that holds)."""
    by_org: dict[str, list[RetentionRequest]] = {}
    for r in requests:
        by_org.setdefault(r.org_id, []).append(r)
    for org in erased or {}:
        by_org.setdefault(org, [])
    parts = []
    for org, rs in sorted(by_org.items()):
        terms = []
        cutoffs = [r.cutoff for r in rs if r.kind == RETENTION]
        if cutoffs:  # the union of "older than" is "older than the latest cut-off"
            terms.append(f"engagement_date < CAST({sql_literal(max(cutoffs).isoformat())} AS DATE)")
        keys = sorted((erased or {}).get(org, ()))
        if keys:
            terms.append(f"engagement_id IN ({', '.join(sql_literal(k) for k in keys)})")
        if terms:
            parts.append(f"(org_id = {sql_literal(org)} AND ({' OR '.join(terms)}))")
    return " OR ".join(parts) or None


def log_predicate(rows: list[dict]) -> str | None:
    """Delete predicate of a change log's rows by their keys (org, commit version, change type, engagement
    id): exactly these rows, with no subject id in it."""
    grouped: dict[tuple, set[str]] = {}
    for r in rows:
        grouped.setdefault((r["org_id"], r["_commit_version"], r["_change_type"]), set()).add(r["engagement_id"])
    parts = [
        f"(org_id = {sql_literal(org)} AND _commit_version = {int(v)} AND _change_type = {sql_literal(t)} "
        f"AND engagement_id IN ({', '.join(sql_literal(e) for e in sorted(ids))}))"
        for (org, v, t), ids in sorted(grouped.items())
    ]
    return " OR ".join(parts) or None
