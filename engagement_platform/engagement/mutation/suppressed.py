"""Mutation requests that name an erased subject are dropped before they are gathered: a conversion or a
merge into an erased id would otherwise bring the person back, and a request waiting for an erased id
would end in quarantine with the id in clear. Only requests of orgs with suppressed subjects are tested."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engagement_platform.engagement.mutation.request_columns import CheckedRequests
from engagement_platform.engagement.mutation.request_text import request_json
from engagement_platform.lake.suppression import Suppressed


def drop_suppressed_requests(
    checked: CheckedRequests, suppressed: Suppressed
) -> tuple[CheckedRequests, list[tuple[str, str]]]:
    """`checked` without the requests whose canonical JSON names a suppressed subject of their org, and the
    (org, subject hash) of each dropped one."""
    table = checked.requests
    if not suppressed or table.num_rows == 0:
        return checked, []
    tested = np.flatnonzero(
        np.asarray(
            pc.is_in(table["org_id"], value_set=pa.array(suppressed.scopes, pa.string())).to_numpy(
                zero_copy_only=False
            ),
            dtype=bool,
        )
    )
    if len(tested) == 0:
        return checked, []
    texts = request_json(table.take(pa.array(tested, pa.int64()))).to_pylist()
    orgs = table["org_id"].take(pa.array(tested, pa.int64())).to_pylist()
    keep = np.ones(table.num_rows, dtype=bool)
    hits = []
    for i, org, text in zip(tested.tolist(), orgs, texts):
        found = suppressed.content_hit(org, [text])
        if found:
            keep[i] = False
            hits.append(found)
    if not hits:
        return checked, []
    records = [r for r, k in zip(checked.records, keep) if k]
    return CheckedRequests(table.filter(pa.array(keep)), records, checked.errors), hits
