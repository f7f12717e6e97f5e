"""Engagement rows and mutation requests for the reduction tests: builders for named cases, and
hypothesis strategies for random tables and batches (small pools, so requests keep colliding)."""

from __future__ import annotations

from datetime import UTC, date, datetime

from hypothesis import strategies as st

from engagement_platform.engagement.mutation.requests import OWNER_FIELDS
from engagement_platform.engagement.mutation.requests import MutationRequest as R

ORG = "00D000001"
D1, D2, D3, D4 = (date(2026, 1, day) for day in (1, 2, 3, 4))


def row(eid, day=D1, **owners):
    return {"org_id": ORG, "engagement_id": eid, "engagement_date": day, "subject": f"s-{eid}", **owners}


def rename(rid, time, old, new, field="lead_id", **dates):
    return R.convert(rid, ORG, time, field, old, field, new, **dates)


# Small pools so that random requests keep hitting the same ids, rows and dates.
POOLS = {name: [f"{name[0].upper()}{i}" for i in range(1, 3)] for name in OWNER_FIELDS}
DAYS = [D1, D2, D3]
EIDS = [f"e{i}" for i in range(4)]
maybe_day = st.one_of(st.none(), st.sampled_from(DAYS))


@st.composite
def owners(draw):
    return {name: draw(st.one_of(st.none(), st.sampled_from(POOLS[name]))) for name in OWNER_FIELDS}


@st.composite
def tables(draw):
    eids = draw(st.lists(st.sampled_from(EIDS), unique=True, min_size=1, max_size=4))
    return [row(eid, draw(maybe_day), **draw(owners())) for eid in eids]


MIXED = ("rename", "rename", "convert", "convert", "merge", "delete_owner", "delete_engagement", "update")


@st.composite
def requests(draw, kinds=MIXED, fields=OWNER_FIELDS, eids=EIDS):
    out = []
    for i in range(draw(st.integers(1, 16))):
        if out and draw(st.integers(0, 9)) == 0:
            out.append(draw(st.sampled_from(out)))  # a redelivered duplicate
            continue
        rid, time = f"r{draw(st.integers(0, 99)):02d}-{i}", draw(st.integers(0, 3))  # equal times are common
        dates = {}
        if draw(st.booleans()):
            dates = {"date_from": draw(maybe_day), "date_to": draw(maybe_day)}
        kind, field, to_field = (
            draw(st.sampled_from(kinds)),
            draw(st.sampled_from(fields)),
            draw(st.sampled_from(fields)),
        )
        owner_id, to_id = draw(st.sampled_from(POOLS[field])), draw(st.sampled_from(POOLS[to_field]))
        if kind == "rename":
            out.append(rename(rid, time, owner_id, draw(st.sampled_from(POOLS[field])), field, **dates))
        elif kind == "convert":
            out.append(R.convert(rid, ORG, time, field, owner_id, to_field, to_id, **dates))
        elif kind == "merge":
            ids = draw(st.lists(st.sampled_from(POOLS[field]), min_size=1, max_size=3))
            out.append(R.merge(rid, ORG, time, field, ids, draw(st.sampled_from(POOLS[field])), **dates))
        elif kind == "delete_owner":
            out.append(R.delete_owner(rid, ORG, time, field, owner_id, **dates))
        elif kind == "delete_engagement":
            out.append(R.delete_engagement(rid, ORG, time, draw(st.sampled_from(eids)), **dates))
        else:
            record = {"engagement_date": draw(maybe_day), "subject": f"u{i}", **draw(owners())}
            out.append(R.update(rid, ORG, time, draw(st.sampled_from(eids)), record, **dates))
    return out


def canonical_rows(batch) -> list[dict]:
    """MutationRequests as the stream's canonical columns (request_time: the tests' small ints as micros)."""
    out = []
    for r in batch:
        row = {
            "request_id": r.request_id,
            "org_id": r.org_id,
            "op": r.op,
            "date_from": r.date_from,
            "date_to": r.date_to,
            "request_time": datetime.fromtimestamp(r.request_time / 1e6, UTC),
        }
        if r.op == "convert":
            row.update(from_field=r.field, from_id=r.owner_id, to_field=r.to_field, to_id=r.to_id)
        elif r.op == "merge":
            row.update(field=r.field, from_ids=list(r.from_ids), to_id=r.to_id)
        elif r.engagement_id is None:
            row.update(field=r.field, id=r.owner_id)
        else:
            row.update(engagement_id=r.engagement_id, record="{}" if r.record is not None else None)
        out.append(row)
    return out
