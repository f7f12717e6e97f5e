"""The slow, obviously correct semantics of a batch of requests: apply them one at a time in
(request_time, request_id) order. Every reduction is tested against it."""

from __future__ import annotations

from collections.abc import Iterable

from engagement_platform.engagement.mutation.requests import MutationRequest, Row, as_table, full_record, in_date_range


def apply_one_by_one(rows, requests: Iterable[MutationRequest]) -> dict[str, Row]:
    """The slow, obviously correct semantics every reduction must reproduce."""
    table = as_table(rows)
    for request in sorted(requests, key=lambda r: r.order):
        _apply_request(table, request)
    return table


def _apply_request(table: dict[str, Row], request: MutationRequest) -> None:
    def hit(row: Row) -> bool:
        return in_date_range(row["engagement_date"], request.date_from, request.date_to)

    if request.op == "convert":
        for row in table.values():
            if row[request.field] == request.owner_id and hit(row):
                row[request.field] = None
                row[request.to_field] = request.to_id
    elif request.op == "merge":
        ids = set(request.from_ids)
        for row in table.values():
            if row[request.field] in ids and hit(row):
                row[request.field] = request.to_id
    elif request.op == "delete" and request.engagement_id is not None:
        row = table.get(request.engagement_id)
        if row is not None and hit(row):
            del table[request.engagement_id]
    elif request.op == "delete":
        for eid in [eid for eid, row in table.items() if row[request.field] == request.owner_id and hit(row)]:
            del table[eid]
    elif request.op == "update":
        row = table.get(request.engagement_id)
        if row is not None and hit(row):
            keys = {"org_id": row["org_id"], "engagement_id": row["engagement_id"]}
            table[request.engagement_id] = {**keys, **full_record(request.record)}
