"""The suppression list's matching (lake/suppression.py) against slow, obviously correct references: an id
field is suppressed iff (scope, id) is among the erased pairs; raw content names a subject iff the plain
whole-token search (retention.requests.mentions) finds an erased id of its scope in it."""

from __future__ import annotations

import json

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.engagement.retention.requests import mentions
from engagement_platform.lake.quarantine import QUARANTINE_SCHEMA
from engagement_platform.lake.suppression import Suppressed, subject_hash
from engagement_platform.lake.suppression_tables import drop_suppressed_quarantine

SECRET = b"test-secret"
ORGS = st.sampled_from(["00D1", "00D2", "00D3"])
IDS = st.text(alphabet="0123456789ABCQ_", min_size=3, max_size=8)


@given(st.sets(st.tuples(ORGS, IDS), max_size=6), ORGS, st.lists(st.one_of(st.none(), IDS), max_size=3))
def test_an_id_field_is_suppressed_iff_its_org_and_id_were_erased(erased, org, ids):
    suppressed = Suppressed.of_subjects(SECRET, erased)
    expected = [i for i in ids if i is not None and (org, i) in erased]
    found = suppressed.hit(org, ids)
    assert (found is not None) == bool(expected)
    if expected:
        assert found == subject_hash(SECRET, org, expected[0])


@given(st.sets(st.tuples(ORGS, IDS), max_size=6), st.one_of(st.none(), ORGS), st.lists(IDS, max_size=6), st.booleans())
def test_raw_content_names_a_subject_iff_a_whole_token_search_finds_an_erased_id_of_its_org(
    erased, org, tokens, as_bytes
):
    suppressed = Suppressed.of_subjects(SECRET, erased)
    text = json.dumps({"lead_id": tokens[0] if tokens else None, "note": " ".join(tokens[1:]) + "!"})
    content = text.encode() if as_bytes else text
    # the reference: every erased id of the record's org (of any org when it has none), searched one by one
    expected = any(mentions(text, sid) for scope, sid in erased if org is None or scope == org)
    assert (suppressed.content_hit(org, [content]) is not None) == expected


def test_hashes_are_keyed_and_scoped():
    assert subject_hash(SECRET, "00D1", "00Q1") != subject_hash(SECRET, "00D2", "00Q1"), (
        "the same id in another org is another person"
    )
    assert subject_hash(SECRET, "00D1", "00Q1") != subject_hash(b"other", "00D1", "00Q1"), (
        "without the secret a guess cannot be tested"
    )
    assert "00Q1" not in subject_hash(SECRET, "00D1", "00Q1")
    assert not Suppressed(SECRET) and Suppressed(SECRET).hit("00D1", ["00Q1"]) is None


@given(
    st.lists(st.tuples(st.one_of(st.none(), ORGS), IDS, st.integers(1, 3)), max_size=8),
    st.sets(st.tuples(ORGS, IDS), max_size=4),
)
def test_quarantine_keeps_every_record_but_those_naming_an_erased_subject_and_counts_each_once(records, erased):
    suppressed = Suppressed.of_subjects(SECRET, erased)
    rows = [
        {
            "row_id": f"t:0:{i}",
            "org_id": org,
            "raw": json.dumps({"lead_id": sid}).encode(),
            "input": None,
            "error_code": "x",
        }
        for i, (org, sid, errors) in enumerate(records)
        for _ in range(errors)
    ]
    table = pa.Table.from_pylist(rows, schema=QUARANTINE_SCHEMA)
    kept, hits = drop_suppressed_quarantine(table, suppressed)
    named = {
        f"t:0:{i}"
        for i, (org, sid, _) in enumerate(records)
        if any(s == sid and (org is None or o == org) for o, s in erased)
    }
    assert set(kept["row_id"].to_pylist()) == {r["row_id"] for r in rows} - named
    assert kept.num_rows == sum(1 for r in rows if r["row_id"] not in named)
    assert len(hits) == len(named)


def test_an_id_in_malformed_or_escaped_content_is_still_found():
    suppressed = Suppressed.of_subjects(SECRET, [("00D1", "usr-gone-0001")])
    for content in (
        '{"primary_id:"usr-gone-0001","x":1}',  # a misplaced quote
        b'{"lead_id": "usr-gone-0001", "tru',  # truncated bytes
        '{"a": "usr\\u002dgone\\u002d0001"}',  # JSON escapes
        "id=usr-gone-0001&x=2",
        "usr-gone-0001,Bob,1990",
    ):  # a query string, a CSV line
        assert suppressed.content_hit("00D1", [content]) is not None, content
    assert suppressed.content_hit("00D1", ["usr-gone-00012 and xusr-gone-0001"]) is None, "a longer id is another id"
