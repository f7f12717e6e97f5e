"""The soak's expected final state, from the workload's messages alone. Nothing of engagement_platform is
imported: the semantics are re-implemented from the README and the request formats' docstrings.

- Records are classified as the pipelines are documented to: empty / too big / not a JSON object, type errors,
  required fields and enums, then the stream's own rules. A quarantined record counts once, under its error codes
  joined by "+"; a producer retry is `duplicate` (duplicate_in_batch, already_in_table or duplicate_request:
  which one depends on batching, the count does not).
- engagement_activity: the first copy of each valid activity, the valid mutation requests applied one at a time in
  (request_time, request_id) order, then rows whose lead_id or contact_id is an erased subject of their org
  removed, then each valid retention request's rows: its org's rows dated before its cut-off (request_time's UTC
  date - retention_days; a null date is kept). A record naming an erased subject (a rejected one by whole-token
  mention, of any org when it has none) is stored nowhere: suppressed, or quarantined and then purged by the erasure.
- Retention is exact when what it deletes was committed before its batch and nothing else moves across its cut-off
  (workload.py's docstring): the request is gated on the ingestion of every earlier round, every row dated before
  the cut-off came in earlier rounds, and no mutation request touches such a row or dates one before it. Anything
  else is a `problem`. Each request's gdpr_audit row counts the rows it deleted (`removed`), in request order: a
  row older than two requests' cut-offs is the earlier one's. An erasure's counts are not predicted.
- Timing: a request whose target came after it may expire (`target_not_found_within_horizon`). The caller passes
  the requests that expired and those still pending: neither applies; pending is unaccounted, expired needs a late target.
- Messages the broker lost (`lost`: sent, not on the topic): the workload chose each request's target from what it
  sent, so a request whose target was only in lost activities finds nothing. The lake holds it back and it expires,
  or, when an earlier request of its batch held that target at the batch's start, it applies and changes nothing
  (soak seed 61). Either outcome is accepted for it, and for the requests whose targets it produced.
- profile_raw/<tenant>: per primary id, the valid changes folded in cdc_seq order (newer non-null keys win, null
  keeps, delete leaves a tombstone, an upsert after it starts empty, links from the newest change carrying
  related_ids). Identity components (the related_ids and component_id columns) are not computed.
- Profile erasure (profiles/erasure/, docs/streams/profile-erasure.md): each valid request erases its
  subject's identity, the component over the links of its tenant's changes staged before it (_profile_erasures: the
  request is gated on the dumper); every row of those ids goes, tombstones included (rows removed, not tombstoned), and
  every change or bad record naming one is stored nowhere (before the request: removed from raw, staging or the
  quarantine; after it, gated on the erasure stream: dropped by the dumper and counted in profile_suppressed_records
  under stream profile_cdc). profile_erasure_audit holds one row per valid request with its ids_erased; a producer
  retry of a request is refused as repeated and, naming an erased id, counted as suppressed under profile_erasure
  instead of quarantined; other refused requests count in quarantine_profile_erasure by reason. The audit's
  rows_removed is not predicted (raw or staged rows, depending on what the processor merged first).
- rewards_members: each landed file's lines after the header (blank ones are no records) through the pipeline's
  stages as pipelines/rewards_members.yaml and the README's "Composable ingest" define them: parse (a line that is
  not 6 CSV fields is malformed_record), the converters in order (split, cast, map_values; a row stops at the first
  that fails), conform (member_id a long, points an int), then every validator at once. A good line is a row keyed
  by member_id; a bad one counts once, under its error codes joined by "+" (the quarantine holds a row per error).
- `problems`: where the workload breaks an assumption this exactness rests on (workload.py's docstring).
"""

from __future__ import annotations

import csv
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial

from benchmarks.soak.workload import (
    ACTIVITIES,
    GDPR,
    INGESTION,
    LANDING,
    MUTATIONS,
    PROFILE_CDC,
    PROFILE_ERASURE,
    PROFILE_ERASURES,
    PROFILES,
    RETENTION,
)

ACTIVITY_TYPES = {
    "email_sent",
    "email_opened",
    "email_clicked",
    "email_replied",
    "email_bounced",
    "call",
    "meeting",
    "video_viewed",
    "linkedin_message",
    "task_completed",
}
OWNER_FIELDS = ("lead_id", "contact_id", "account_id", "user_id")
CHECKED = ("lead_id", "contact_id", "account_id", "user_id", "engagement_date", "activity_type", "subject")
MAX_BYTES = {ACTIVITIES: 65536, MUTATIONS: 65536, GDPR: 65536, PROFILES: 262144, PROFILE_ERASURES: 65536}
DUPLICATE, EXPIRED = "duplicate", "target_not_found_within_horizon"
OP_REQUIRED = {
    "convert": ("from_field", "from_id", "to_field", "to_id"),
    "merge": ("field", "from_ids", "to_id"),
    "update": ("engagement_id", "record"),
}
TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
# pipelines/rewards_members.yaml, written out rather than read: the oracle states the rules it expects. Regexes
# with re.ASCII: \s as Java's (Spark's regexp_like).
MEMBER_SOURCE = ("id", "name", "bday", "level", "email", "points")  # CSV columns are positional
MEMBER_COLUMNS = ("member_id", "first_name", "last_name", "birth_date", "rewards_level", "email", "points")
MEMBER_MAX_BYTES = 1_048_576  # the source's default max_record_bytes
LEVELS = {
    "b": "bronze",
    "s": "silver",
    "g": "gold",
    "bronze": "bronze",
    "silver": "silver",
    "gold": "gold",
}  # case-insensitive keys
# The cast's formats in order, MM/dd/yyyy then yyyy-MM-dd: (pattern, groups of year, month, day)
DATE_FORMATS = (
    (re.compile(r"(\d{2})/(\d{2})/(\d{4})"), (3, 1, 2)),
    (re.compile(r"(\d{4})-(\d{2})-(\d{2})"), (1, 2, 3)),
)
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]+$", re.ASCII)
FIRST_NAME = re.compile(r"^[A-Za-z' -]+$", re.ASCII)


@dataclass
class Expected:
    activities: dict = field(default_factory=dict)  # (org, engagement_id) -> {org_id and CHECKED columns}
    quarantine: dict = field(
        default_factory=lambda: {
            t: Counter() for t in (ACTIVITIES, MUTATIONS, GDPR, PROFILES, PROFILE_ERASURES, LANDING)
        }
    )
    requests: set = field(default_factory=set)  # (org, request_id) of valid mutation requests: the request log's rows
    gdpr_requests: set = field(default_factory=set)  # (org, request_id) of valid GDPR requests: gdpr_audit's rows
    removed: dict = field(
        default_factory=dict
    )  # (org, request_id) of a valid retention request -> engagement_activity rows it deletes
    late: set = field(default_factory=set)  # requests whose target came after them (may expire)
    profiles: dict = field(default_factory=dict)  # tenant -> primary_id -> {deleted, fields, linked_ids, cdc_seq}
    profile_erasures: dict = field(
        default_factory=dict
    )  # (tenant, request_id) of a valid profile erasure -> ids it erases
    suppressed: Counter = field(default_factory=Counter)  # stream -> records dropped for naming an erased profile id
    members: dict = field(default_factory=dict)  # member_id -> {MEMBER_COLUMNS}: the rewards_members table
    unaccounted: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def expected(
    messages, expired=frozenset(), pending=frozenset(), now: datetime | None = None, landed=(), lost=()
) -> Expected:
    """`expired` / `pending`: (org_id, request_id) of the requests the lake quarantined as expired / still holds;
    `landed`: the landing files (workload.LandingFile) that were landed, in order; `lost`: messages sent that the
    topics do not hold (the broker lost them)."""
    out, by_topic = (
        Expected(),
        {t: [m for m in messages if m.topic == t] for t in (ACTIVITIES, MUTATIONS, GDPR, PROFILES, PROFILE_ERASURES)},
    )
    erased, retentions = _gdpr(by_topic[GDPR], now or datetime.now(UTC), out)
    uses = _activities(by_topic[ACTIVITIES], erased, out)
    requests = _requests(by_topic[MUTATIONS], erased, out)
    _crossing_cutoffs(requests, retentions, out)
    _apply(requests, uses, set(expired), set(pending), out, _named(m for m in lost if m.topic == ACTIVITIES))
    _profiles(by_topic[PROFILES], out, _profile_erasures(by_topic[PROFILE_ERASURES], by_topic[PROFILES], out))
    _members(landed, out)
    out.activities = {
        k: r for k, r in out.activities.items() if not {r["lead_id"], r["contact_id"]} & set(erased.get(k[0], {}))
    }
    _retain(retentions, uses, out)
    return out


def parse(value: bytes, topic: str) -> tuple[dict | None, set[str]]:
    if not value or len(value) > MAX_BYTES[topic]:
        return None, {"oversized" if value else "empty_record"}
    record = loads(value)
    return (record, set()) if isinstance(record, dict) else (None, {"malformed_record"})


def columns(record: dict, names) -> dict:
    """JSON values as string columns hold them: strings as themselves, anything else as its JSON text."""
    return {n: v if v is None or isinstance(v, str) else json.dumps(v) for n, v in ((n, record.get(n)) for n in names)}


def blank(value) -> bool:
    return value is None or not value.strip()


def attempt(convert, value):
    """convert(value), or None when the value does not convert."""
    try:
        return convert(value)
    except (AttributeError, TypeError, ValueError):
        return None


def timestamp(value: str | None) -> datetime | None:
    t = attempt(lambda v: datetime.fromisoformat(v.replace("Z", "+00:00")), value)
    return t if t is None or t.tzinfo else t.replace(tzinfo=UTC)


day = partial(attempt, date.fromisoformat)
loads = partial(attempt, json.loads)


def integer(value: str | None) -> int | None:
    return int(value) if value is not None and re.fullmatch(r"\s*[+-]?\d+\s*", value) else None


def typed(v: dict, parsers: dict) -> bool:
    """Whether every present column of `v` named in `parsers` converts (the pipelines' convert stage)."""
    return all(v[n] is None or parse_(v[n]) is not None for n, parse_ in parsers.items())


def checked(v: dict, required, enums: dict) -> set[str]:
    """The validate stage: required (missing or blank) and enum columns."""
    return {"missing_required" for n in required if blank(v[n])} | {
        "not_in_enum" for n, allowed in enums.items() if v[n] is not None and v[n] not in allowed
    }


def names_erased(raw: bytes, org: str | None, erased: dict) -> bool:
    """Whether the content holds an erased subject of `org` (any org's when None) as a whole token: not next to a
    letter, digit or underscore."""
    content = raw.decode("utf-8", "replace")
    return any(
        re.search(rf"(?<![A-Za-z0-9_]){re.escape(s)}(?![A-Za-z0-9_])", content)
        for o in ([org] if org is not None else list(erased))
        for s in erased.get(o, ())
    )


def count(out: Expected, topic: str, reasons: set[str]) -> None:
    out.quarantine[topic]["+".join(sorted(reasons))] += 1


def classify_activity(record: dict) -> tuple[dict | None, set[str]]:
    v = columns(
        record,
        (
            "org_id",
            "engagement_id",
            "activity_type",
            "event_time",
            "engagement_date",
            "duration_seconds",
            "subject",
            *OWNER_FIELDS,
        ),
    )
    if not typed(v, {"event_time": timestamp, "duration_seconds": integer, "engagement_date": day}):
        return None, {"wrong_type"}
    errors = checked(v, ("org_id", "engagement_id", "activity_type", "event_time"), {"activity_type": ACTIVITY_TYPES})
    if errors:
        return None, errors
    when = day(v["engagement_date"]) or timestamp(v["event_time"]).astimezone(UTC).date()
    return {
        **{n: v[n] for n in ("org_id", *CHECKED) if n != "engagement_date"},
        "engagement_date": when,
        "id": v["engagement_id"],
    }, set()


def _activities(messages, erased: dict, out: Expected) -> dict:
    """Fills out.activities and the ingestion quarantine; returns the rounds in which activities name each
    (org, owner field, id) and (org, "engagement_id", id): the exactness checks need them."""
    uses = defaultdict(list)
    for m in messages:
        record, reasons = parse(m.value, ACTIVITIES)
        row, reasons = classify_activity(record) if record is not None else (None, reasons)
        org = row["org_id"] if row else columns(record or {}, ("org_id",))["org_id"]
        if row is None:
            if not names_erased(m.value, org, erased):  # else quarantined then purged, or suppressed
                count(out, ACTIVITIES, reasons)
            continue
        key = (org, row.pop("id"))
        for name, value in (("engagement_id", key[1]), *((f, row[f]) for f in OWNER_FIELDS)):
            if value is not None:
                uses[(org, name, value)].append(m.round)
        if subjects := {row["lead_id"], row["contact_id"]} & set(erased.get(org, {})):
            at, gate = min(erased[org][s] for s in subjects), m.gate
            if m.round >= at and (gate is None or (gate.stream, gate.topic) != (RETENTION, GDPR) or gate.round < at):
                out.problems.append(
                    f"activity {key[1]} names an erased subject in or after its erasure's round, ungated"
                )
            continue  # deleted by the erasure, or suppressed after it
        if key in out.activities:
            count(out, ACTIVITIES, {DUPLICATE})
        else:
            out.activities[key] = row
    return uses


def classify_request(record: dict) -> tuple[dict | None, set[str]]:
    v = columns(
        record,
        (
            "request_id",
            "org_id",
            "request_time",
            "op",
            "from_field",
            "from_id",
            "to_field",
            "to_id",
            "field",
            "from_ids",
            "id",
            "engagement_id",
            "record",
            "date_from",
            "date_to",
        ),
    )
    if not typed(v, {"request_time": timestamp, "date_from": day, "date_to": day}):
        return None, {"wrong_type"}
    errors = checked(
        v,
        ("request_id", "org_id", "request_time", "op"),
        {
            "op": ("convert", "merge", "delete", "update"),
            **{n: OWNER_FIELDS for n in ("from_field", "to_field", "field")},
        },
    )
    if errors:
        return None, errors
    op, lo, hi = v["op"], day(v["date_from"]), day(v["date_to"])
    errors = {
        "missing_required"
        for n in OP_REQUIRED.get(op, ("field", "id") if v["engagement_id"] is None else ())
        if blank(v[n])
    }
    if op == "delete" and v["engagement_id"] is not None and (v["field"] is not None or v["id"] is not None):
        errors.add("ambiguous_target")
    ids, body = loads(v["from_ids"]) if op == "merge" else None, loads(v["record"]) if op == "update" else None
    errors |= (
        {"wrong_type"}
        if (
            op == "merge"
            and v["from_ids"] is not None
            and not (isinstance(ids, list) and ids and all(isinstance(x, str) and x for x in ids))
        )
        or (op == "update" and v["record"] is not None and not isinstance(body, dict))
        else set()
    )
    errors |= {"invalid_date_range"} if lo and hi and lo > hi else set()
    return None if errors else {
        "org": v["org_id"],
        "id": v["request_id"],
        "time": timestamp(v["request_time"]),
        "op": op,
        "to_field": v["to_field"],
        "field": v["from_field"] if op == "convert" else v["field"],
        "owner": v["from_id"] if op == "convert" else v["id"],
        "from_ids": ids or [],
        "to_id": v["to_id"],
        "engagement_id": v["engagement_id"],
        "record": body,
        "date_from": lo,
        "date_to": hi,
    }, errors


def _requests(messages, erased: dict, out: Expected) -> list[dict]:
    valid = []
    for m in messages:
        if m.gate is None or (m.gate.stream, m.gate.topic) != (INGESTION, ACTIVITIES) or m.gate.round < m.round - 1:
            out.problems.append(f"mutation message {m.index} is not gated on the ingestion of every earlier round")
        record, reasons = parse(m.value, MUTATIONS)
        request, reasons = classify_request(record) if record is not None else (None, reasons)
        if names_erased(m.value, request["org"] if request else columns(record or {}, ("org_id",))["org_id"], erased):
            if request is not None:
                out.problems.append(
                    f"mutation request {request['id']} names an erased subject: applied or dropped depending on timing"
                )
            continue
        if reasons or (request["org"], request["id"]) in out.requests:
            count(out, MUTATIONS, reasons or {DUPLICATE})
            continue
        out.requests.add((request["org"], request["id"]))
        valid.append({**request, "round": m.round})
    return sorted(valid, key=lambda r: (r["time"], r["id"]))


def _needs(r: dict) -> list[tuple]:
    """What a request needs from the table: owner positions, or its engagement."""
    if r["op"] == "convert" or (r["op"] == "delete" and r["engagement_id"] is None):
        return [(r["org"], r["field"], r["owner"])]
    if r["op"] == "merge":
        return [(r["org"], r["field"], i) for i in r["from_ids"] if i != r["to_id"]]
    return [(r["org"], "engagement_id", r["engagement_id"])]


def _named(activities) -> set[tuple]:
    """(org, field, id) of every owner and engagement id the given activity messages name (however bad they are)."""
    named = set()
    for m in activities:
        record = loads(m.value)
        if isinstance(record, dict) and isinstance(org := record.get("org_id"), str):
            named |= {(org, f, v) for f in ("engagement_id", *OWNER_FIELDS) if isinstance(v := record.get(f), str)}
    return named


def _finds_nothing(table: dict, r: dict) -> bool:
    """Whether `r` would find no row holding one of its targets (a dry run of _apply_one on a copy of its org)."""
    missing, _ = _apply_one({k: dict(row) for k, row in table.items() if k[0] == r["org"]}, r)
    return bool(missing)


def _apply(
    requests: list[dict], uses: dict, expired: set, pending: set, out: Expected, lost: set = frozenset()
) -> None:
    """The valid requests one at a time (the reference semantics), with the checks exactness rests on. `lost`: the
    (org, field, id) named by activities the broker lost; a request needing one, or an id a request produced from
    one, may find nothing (the module docstring)."""
    needed = Counter(n for r in requests for n in _needs(r))
    produced = {
        (r["org"], r["to_field"] if r["op"] == "convert" else r["field"], r["to_id"])
        for r in requests
        if r["op"] in ("convert", "merge")
    }
    lost = set(lost)
    for r in requests:
        key, rounds = (r["org"], r["id"]), [u for n in _needs(r) for u in uses.get(n, [])]
        touches_lost = any(n in lost for n in _needs(r))
        if touches_lost and r["op"] in ("convert", "merge"):
            lost.add((r["org"], r["to_field"] if r["op"] == "convert" else r["field"], r["to_id"]))
        if any(u >= r["round"] for u in rounds):  # its target comes in its round or later: it may wait, then expire
            out.late.add(key)
            if any(u < r["round"] for u in rounds) or any(needed[n] > 1 or n in produced for n in _needs(r)):
                out.problems.append(
                    f"request {r['id']}: an activity it touches comes after it, or another request shares its target"
                )
        elif (
            not rounds and key in expired and not any(n in produced for n in _needs(r))
        ):  # its target never reached the
            out.late.add(key)  # topic (the broker lost it): it could only wait, then expire (soak seed 59)
        elif key in expired and touches_lost and _finds_nothing(out.activities, r):  # the rows in its scope were lost
            out.late.add(key)
        if key in expired:
            count(out, MUTATIONS, {EXPIRED})
            if key not in out.late:
                out.problems.append(f"request {r['id']} expired although its target was committed before it was sent")
        elif key in pending:
            out.unaccounted.append(f"mutation request {r['id']} is neither applied nor quarantined (still pending)")
        else:
            missing, deleted = _apply_one(out.activities, r)
            if (
                missing and not touches_lost
            ):  # the lake holds such a request back (or not, if a request of its batch had the target)
                out.problems.append(f"request {r['id']} finds no row holding {sorted(missing)} when it applies")
            for eid in deleted:  # a retry of it sent later would be appended again
                if len(copies := uses.get((r["org"], "engagement_id", eid), [])) > 1 and max(copies) >= r["round"]:
                    out.problems.append(
                        f"engagement {eid} is sent again in or after the round of the request deleting it"
                    )
    out.problems += [
        f"expired request {key} is not a valid request of the workload" for key in sorted(expired - out.requests)
    ]


def _apply_one(table: dict, r: dict) -> tuple[set[str], list[str]]:
    """One request on the rows ((org, engagement_id) -> row): (the targets it found no row of, the ids it deleted)."""

    def hit(row) -> bool:
        d = row["engagement_date"] or date.min  # a null date orders first
        return (r["date_from"] is None or d >= r["date_from"]) and (r["date_to"] is None or d <= r["date_to"])

    rows = {k: row for k, row in table.items() if k[0] == r["org"]}
    if r["op"] in ("convert", "merge"):
        sources = {r["owner"]} if r["op"] == "convert" else set(r["from_ids"]) - {r["to_id"]}
        hits = [row for row in rows.values() if row[r["field"]] in sources and hit(row)]
        missing = sources - {row[r["field"]] for row in hits}
        for row in hits:
            row[r["field"]] = None
            row[r["to_field"] if r["op"] == "convert" else r["field"]] = r["to_id"]
        return missing, []
    if r["op"] == "delete":
        gone = [
            k
            for k, row in rows.items()
            if hit(row) and (k[1] == r["engagement_id"] if r["engagement_id"] else row[r["field"]] == r["owner"])
        ]
        for k in gone:
            del table[k]
        return ({r["engagement_id"] or r["owner"]} if not gone else set()), [k[1] for k in gone]
    if (row := rows.get((r["org"], r["engagement_id"]))) is None or not hit(row):
        return {r["engagement_id"]}, []
    row.update(
        {n: None for n in (*OWNER_FIELDS, "engagement_date")}, **{n: x for n, x in r["record"].items() if n in CHECKED}
    )
    row["engagement_date"] = (
        day(row["engagement_date"]) if isinstance(row["engagement_date"], str) else row["engagement_date"]
    )
    return set(), []  # update: owners and date replaced, the other columns it names set


def _gdpr(messages, now: datetime, out: Expected) -> tuple[dict[str, dict[str, int]], list[dict]]:
    """(org -> erased subject -> the round of its erasure request, the valid retention requests in request order);
    fills the GDPR quarantine and valid requests."""
    erased, retentions, refused = defaultdict(dict), [], []
    for m in messages:
        record, reasons = parse(m.value, GDPR)
        v = columns(record or {}, ("request_id", "org_id", "request_time", "kind", "retention_days", "subject_id"))
        if record is not None and not typed(v, {"request_time": timestamp, "retention_days": integer}):
            reasons = {"wrong_type"}
        elif record is not None:
            reasons = checked(v, ("request_id", "org_id", "request_time", "kind"), {"kind": ("retention", "erasure")})
            if v["retention_days"] is not None and not 1 <= integer(v["retention_days"]) <= 36500:
                reasons.add("out_of_range")
            if not reasons:
                needed, unwanted = (
                    ("retention_days", "subject_id") if v["kind"] == "retention" else ("subject_id", "retention_days")
                )
                reasons = ({"missing_required"} if blank(v[needed]) else set()) | (
                    {"unexpected_field"} if v[unwanted] is not None else set()
                )
                reasons |= (
                    {"request_time_in_future"} if timestamp(v["request_time"]) > now + timedelta(days=1) else set()
                )
            if not reasons and (v["org_id"], v["request_id"]) in out.gdpr_requests:
                reasons = {DUPLICATE}
        if reasons:
            refused.append((m.value, v["org_id"], reasons))
            continue
        out.gdpr_requests.add((v["org_id"], v["request_id"]))
        if v["kind"] == "erasure":
            erased[v["org_id"]].setdefault(v["subject_id"], m.round)
            continue
        if m.gate is None or (m.gate.stream, m.gate.topic) != (INGESTION, ACTIVITIES) or m.gate.round < m.round - 1:
            out.problems.append(
                f"retention request {v['request_id']} is not gated on the ingestion of every earlier round"
            )
        at = timestamp(v["request_time"])
        retentions.append(
            {
                "org": v["org_id"],
                "id": v["request_id"],
                "time": at,
                "round": m.round,
                "cutoff": at.astimezone(UTC).date() - timedelta(days=integer(v["retention_days"])),
            }
        )
    for raw, org, reasons in refused:  # a refused request naming an erased subject is purged, or never kept
        if not names_erased(raw, org, erased):
            count(out, GDPR, reasons)
    return erased, _in_request_order(retentions, out)


def _in_request_order(retentions: list[dict], out: Expected) -> list[dict]:
    """The retention requests (in send order) in (request_time, request_id) order: one batch applies its requests in
    that order, later batches after earlier ones, which hold the requests sent before (an org's are on one partition).
    Where an org's requests are sent in another order, which of them a row counts for depends on the batching."""
    ordered = sorted(retentions, key=lambda t: (t["time"], t["id"]))
    for i, t in enumerate(ordered):
        if later := [e for e in ordered[:i] if e["org"] == t["org"] and retentions.index(e) > retentions.index(t)]:
            out.problems.append(
                f"retention request {later[0]['id']} is sent after {t['id']} but comes first in request order: "
                f"its gdpr_audit count depends on the batching"
            )
    return ordered


def _crossing_cutoffs(requests: list[dict], retentions: list[dict], out: Expected) -> None:
    """Reports the mutation requests whose outcome would depend on whether a retention batch ran first: those that
    touch a row dated before a cut-off of their org (as ingested), or date a row before one. Before _apply."""
    latest = {}  # org -> its latest cut-off: every older row goes by the end
    for t in retentions:
        latest[t["org"]] = max(latest.get(t["org"], t["cutoff"]), t["cutoff"])
    aged = {
        (org, name, value)
        for (org, eid), row in out.activities.items()
        if org in latest and row["engagement_date"] is not None and row["engagement_date"] < latest[org]
        for name, value in (("engagement_id", eid), ("lead_id", row["lead_id"]), ("contact_id", row["contact_id"]))
        if value is not None
    }
    for r in requests:
        dated = day(r["record"].get("engagement_date")) if r["op"] == "update" else None
        if any(n in aged for n in _needs(r)) or (dated is not None and r["org"] in latest and dated < latest[r["org"]]):
            out.problems.append(
                f"mutation request {r['id']} touches or dates a row before a retention cut-off of its org: "
                f"applied before or after the retention batch, depending on timing"
            )


def _retain(retentions: list[dict], uses: dict, out: Expected) -> None:
    """Each retention request in request order deletes its org's rows dated before its cut-off, counted for it
    (gdpr_audit). A row dated before the cut-off whose activity came in the request's round or later may have been
    ingested after the batch: a problem."""
    for t in retentions:
        gone = [
            k
            for k, row in out.activities.items()
            if k[0] == t["org"] and row["engagement_date"] is not None and row["engagement_date"] < t["cutoff"]
        ]
        for k in gone:
            if any(u >= t["round"] for u in uses.get((k[0], "engagement_id", k[1]), [])):
                out.problems.append(
                    f"engagement {k[1]}, dated before the cut-off of retention request {t['id']}, comes in or "
                    f"after its round: deleted or kept depending on timing"
                )
            del out.activities[k]
        out.removed[(t["org"], t["id"])] = len(gone)


def classify_change(record: dict) -> tuple[dict | None, set[str]]:
    v = columns(record, ("tenant", "primary_id", "record_type", "op", "cdc_seq", "cdc_ts", "fields", "related_ids"))
    if not typed(v, {"cdc_seq": integer, "cdc_ts": timestamp}):
        return None, {"wrong_type"}
    errors = checked(
        v, ("tenant", "primary_id", "record_type", "op", "cdc_seq", "cdc_ts"), {"op": ("upsert", "delete")}
    )
    errors |= {"pattern_mismatch"} if v["tenant"] is not None and not TENANT.match(v["tenant"]) else set()
    errors |= {"out_of_range"} if v["cdc_seq"] is not None and integer(v["cdc_seq"]) < 0 else set()
    fields, related = loads(v["fields"]), loads(v["related_ids"])
    errors |= (
        {"invalid_json"}
        if (v["fields"] is not None and not isinstance(fields, dict))
        or (v["related_ids"] is not None and not isinstance(related, list))
        else set()
    )
    return None if errors else {
        "tenant": v["tenant"],
        "id": v["primary_id"],
        "op": v["op"],
        "seq": integer(v["cdc_seq"]),
        "fields": fields,
        "related": None if related is None else [x if isinstance(x, str) else json.dumps(x) for x in related],
    }, errors


def names_profile(change: dict, ids) -> bool:
    """Whether a valid change names one of `ids` (of its tenant): its primary id or a related id."""
    return change["id"] in ids or bool(set(change["related"] or ()) & set(ids))


def classify_profile_erasure(record: dict) -> tuple[dict | None, set[str]]:
    """profiles/erasure/pipeline.yaml: four required columns, request_time a timestamp, tenant the CDC's pattern."""
    v = columns(record, ("request_id", "tenant", "subject_id", "request_time"))
    if not typed(v, {"request_time": timestamp}):
        return None, {"wrong_type"}
    errors = checked(v, ("request_id", "tenant", "subject_id", "request_time"), {})
    errors |= {"pattern_mismatch"} if v["tenant"] is not None and not TENANT.match(v["tenant"]) else set()
    return None if errors else {"id": v["request_id"], "tenant": v["tenant"], "subject": v["subject_id"]}, errors


def _component(subject: str, links) -> set[str]:
    """The ids connected to `subject` through (primary id, related ids) pairs (profiles/erasure/identity.py's rule)."""
    edges = defaultdict(set)
    for primary, related in links:
        for other in related or ():
            if other and other != primary:
                edges[primary].add(other)
                edges[other].add(primary)
    seen, frontier = {subject}, [subject]
    while frontier:
        for other in edges[frontier.pop()] - seen:
            seen.add(other)
            frontier.append(other)
    return seen


def _fold_links(changes: list[dict]) -> dict[str, list[str]]:
    """primary id -> linked_ids after its changes in sequence order (the raw table's links once all are merged)."""
    state = {}
    for c in sorted(changes, key=lambda c: c["seq"]):
        if c["op"] == "delete":
            state[c["id"]] = []
        elif c["related"] is not None:
            state[c["id"]] = c["related"]
        else:
            state.setdefault(c["id"], [])
    return state


def _profile_erasures(requests, cdc, out: Expected) -> dict[str, dict[str, int]]:
    """tenant -> erased id -> the round of the request erasing it; fills the profile erasure quarantine, the valid
    requests with the ids each erases (profile_erasure_audit's ids_erased) and the records suppressed per stream.

    A request's identity is the component of its subject over the links of the valid changes of its tenant that the
    dumper staged before its batch: those of rounds <= its gate's (Gate(PROFILE_CDC, PROFILES, g); ungated ones only,
    a gated one may still wait), less changes naming an id erased earlier. The platform reads the merged ones' links from
    the raw table (each id's newest related_ids) and the unmerged ones' from staging: between the newest links and every
    link, so the two components must agree (else: a problem). A change or bad record naming an erased id afterwards is
    either gated on the erasure stream having committed the request (dropped by the dumper: suppressed) or a problem."""
    changes, bad = [], []  # (message, valid change) / (message, tenant column) in send order
    for m in cdc:
        record, reasons = parse(m.value, PROFILES)
        change, reasons = classify_change(record) if record is not None else (None, reasons)
        if reasons:
            bad.append((m, columns(record or {}, ("tenant",))["tenant"]))
        else:
            changes.append((m, change))
    erased, erasures, refused = defaultdict(dict), [], []
    for m in requests:
        record, reasons = parse(m.value, PROFILE_ERASURES)
        request, reasons = classify_profile_erasure(record) if record is not None else (None, reasons)
        if reasons:
            refused.append((m.value, columns(record or {}, ("tenant",))["tenant"], reasons))
            continue
        tenant, key = request["tenant"], (request["tenant"], request["id"])
        if (
            key in out.profile_erasures
        ):  # refused as repeated, and it names its subject, erased: suppressed, not quarantined
            out.suppressed[PROFILE_ERASURE] += 1
            continue
        gate = m.gate
        if gate is None or (gate.stream, gate.topic) != (PROFILE_CDC, PROFILES):
            out.problems.append(
                f"profile erasure {request['id']} is not gated on the dumper: its identity depends on what was staged"
            )
            g = m.round - 1
        else:
            g = gate.round
        before = [
            c
            for n, c in changes
            if c["tenant"] == tenant
            and n.round <= g
            and n.gate is None
            and not names_profile(c, erased.get(tenant, {}))
        ]
        ids = _component(request["subject"], ((c["id"], c["related"]) for c in before))
        if ids != _component(request["subject"], _fold_links(before).items()):
            out.problems.append(
                f"profile erasure {request['id']}: an older link of its identity was replaced, so which ids go depends "
                f"on what the processor merged"
            )
        out.profile_erasures[key] = len(ids)
        erasures.append((m.round, g, tenant, ids))
        for i in ids:
            erased[tenant].setdefault(i, m.round)
    for raw, tenant, reasons in refused:
        if names_erased(raw, tenant, erased):
            out.problems.append(
                "a refused profile erasure request names an erased id: purged from quarantine or suppressed, by timing"
            )
        else:
            count(out, PROFILE_ERASURES, reasons)

    def names(m, change: dict | None, tenant: str | None, erasure_tenant: str, ids: set[str]) -> bool:
        if change is not None:
            return change["tenant"] == erasure_tenant and names_profile(change, ids)
        return names_erased(
            m.value, tenant, {erasure_tenant: ids}
        )  # a bad record: by content (any tenant's without one)

    for m, change, tenant in [(m, c, c["tenant"]) for m, c in changes] + [(m, None, t) for m, t in bad]:
        hit = next(((r, g) for r, g, t, ids in erasures if names(m, change, tenant, t, ids)), None)
        if hit is None:
            continue
        r, g = hit
        if (
            m.gate is not None
            and (m.gate.stream, m.gate.topic) == (PROFILE_ERASURE, PROFILE_ERASURES)
            and m.gate.round >= r
            and m.gate.queued
        ):
            out.suppressed[PROFILE_CDC] += 1  # staged after the erasure committed: the dumper drops it
        elif not (m.round <= g and m.gate is None):  # before: staged (or quarantined), then removed by the erasure
            out.problems.append(
                f"profile message {m.index} names an erased id after its erasure's gate round, not gated on the "
                f"erasure: stored, then removed, or suppressed, depending on timing"
            )
    return erased


def _profiles(messages, out: Expected, erased: dict | None = None) -> None:
    """`erased`: tenant -> ids of erased identities (_profile_erasures): no change or bad record naming one is stored."""
    changes, erased = defaultdict(list), erased or {}  # (tenant, id) -> valid changes in arrival order
    for m in messages:
        record, reasons = parse(m.value, PROFILES)
        change, reasons = classify_change(record) if record is not None else (None, reasons)
        if reasons:
            if not names_erased(
                m.value, columns(record or {}, ("tenant",))["tenant"], erased
            ):  # else deleted or suppressed
                count(out, PROFILES, reasons)
        elif not names_profile(change, erased.get(change["tenant"], {})):  # else removed by its erasure, or suppressed
            changes[(change["tenant"], change["id"])].append(change)
    for (tenant, pid), arrived in changes.items():
        ordered = sorted(arrived, key=lambda c: c["seq"])
        for i, c in enumerate(arrived):  # a late change is dropped or folded by batching: newer ones must make it moot
            if any(e["seq"] > c["seq"] for e in arrived[:i]):
                later = [n for n in ordered if n["seq"] > c["seq"]]
                keys = [{k for k, x in (n["fields"] or {}).items() if x is not None} for n in (c, *later)]
                if not (
                    any(n["op"] == "delete" for n in later)
                    or (
                        c["op"] == "upsert"
                        and keys[0] <= set().union(*keys[1:])
                        and (c["related"] is None or any(n["related"] is not None for n in later))
                    )
                ):
                    out.problems.append(
                        f"late profile change {tenant}/{pid}@{c['seq']}: its outcome depends on batching"
                    )
        state = None
        for c in ordered:
            if c["op"] == "delete":
                state = {"deleted": True, "fields": None, "linked_ids": [], "cdc_seq": c["seq"]}
                continue
            alive = state is not None and not state["deleted"]
            fields = {
                **(state["fields"] if alive else {}),
                **{k: x for k, x in (c["fields"] or {}).items() if x is not None},
            }
            linked = (
                list(dict.fromkeys(c["related"]))
                if c["related"] is not None
                else (state["linked_ids"] if alive else [])
            )
            state = {"deleted": False, "fields": fields, "linked_ids": linked, "cdc_seq": c["seq"]}
        out.profiles.setdefault(tenant, {})[pid] = state


def data_lines(data: bytes) -> list[bytes]:
    """A CSV file's records: its lines after the header, without a final CR; blank lines are not records."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line
    return [line.removesuffix(b"\r") for line in lines[1:] if line.strip()]


def member_date(value: str) -> date | None:
    """The cast's formats in order (MM/dd/yyyy, then yyyy-MM-dd); None when neither gives a date."""
    for pattern, (y, m, d) in DATE_FORMATS:
        if (match := pattern.fullmatch(value)) and (
            when := attempt(lambda g: date(int(g[y]), int(g[m]), int(g[d])), match)
        ):
            return when
    return None


def within(value: int | None, bits: int) -> bool:
    return value is not None and -(1 << (bits - 1)) <= value < 1 << (bits - 1)


def classify_member(raw: bytes) -> tuple[dict | None, set[str]]:
    """One rewards_members record: (its target row, set()) or (None, its error codes). A stage that fails stops the
    record there; converters stop at the first that fails; the validators all report."""
    if len(raw) > MEMBER_MAX_BYTES:
        return None, {"oversized"}
    try:
        (fields,) = csv.reader([raw.decode("utf-8", "replace")], strict=True)
    except (csv.Error, ValueError):  # an unclosed quote, or more than one row
        return None, {"malformed_record"}
    if len(fields) != len(MEMBER_SOURCE):
        return None, {"malformed_record"}
    v = {n: x or None for n, x in zip(MEMBER_SOURCE, fields)}  # an empty field is null
    if v["name"] is None:  # split: min_parts 1
        return None, {"split_mismatch"}
    first, space, last = v["name"].strip(" ").partition(" ")
    birth = member_date(v["bday"]) if v["bday"] is not None else None
    if v["bday"] is not None and birth is None:  # cast
        return None, {"wrong_type"}
    level = LEVELS.get(v["level"].lower()) if v["level"] is not None else None
    if v["level"] is not None and level is None:  # map_values without a default
        return None, {"unmapped_value"}
    member_id, points = integer(v["id"]), integer(v["points"])
    if (v["id"] is not None and not within(member_id, 64)) or (
        v["points"] is not None and not within(points, 32)
    ):  # conform
        return None, {"wrong_type"}
    email, last = v["email"], last if space else None
    # the target schema's constraints and the listed validators (required email, first_name's regex), all at once
    errors = {"missing_required"} if member_id is None or blank(first) or blank(email) else set()
    errors |= (
        {"out_of_range"}
        if (birth and birth < date(1900, 1, 1)) or (points is not None and not 0 <= points <= 1_000_000)
        else set()
    )
    errors |= (
        {"pattern_mismatch"}
        if (email is not None and not EMAIL.search(email)) or not FIRST_NAME.search(first)
        else set()
    )
    return None if errors else dict(zip(MEMBER_COLUMNS, (member_id, first, last, birth, level, email, points))), errors


def _members(files, out: Expected) -> None:
    """The landed files (each read whole by one batch): good rows by member id, bad lines counted by their error codes."""
    for f in files:
        for raw in data_lines(f.data):
            row, reasons = classify_member(raw)
            if reasons:
                count(out, LANDING, reasons)
            elif row["member_id"] in out.members:  # the table appends: it would hold both
                out.problems.append(f"member {row['member_id']} is in two landed lines ({f.name})")
            else:
                out.members[row["member_id"]] = row
