"""The vectorized CSV parse held to the record-format contract: generated lines (plain and quoted fields,
separators and quotes inside values, broken lines) through the DuckDB plan and through the reference's
character-by-character reader (reference.read_csv_line) must give the same rows, errors, raw bytes and input.

DuckDB only, no Spark (test_apply.py in landing/ runs a CSV file through both the plan and Spark's from_csv)."""

from __future__ import annotations

from functools import cache

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.sql_types import NoSqlForm
from engagement_platform.ingest.vector_plan import VectorPlan, compile_plan
from engagement_platform_tests.ingest.generated_csv import csv_batches
from engagement_platform_tests.ingest.generated_records import Column, RecordShape, plain_texts
from engagement_platform_tests.ingest.test_vector_plan import (
    EXAMPLES,
    MEMBERS,
    REPO,
    assert_matches,
    config_from,
)

MEMBERS_LIMIT = 300
CSV_MEMBERS = RecordShape({name: MEMBERS.columns[name] for name in ("id", "name", "bday", "level", "email", "points")})
DIALECTS = {"comma": (",", '"'), "semicolon": (";", "'"), "tab": ("\t", "|")}
texts_near_the_dialects = st.one_of(plain_texts, st.text(",;'|\t\"a \r", max_size=6))
TEXTS = RecordShape({name: Column(texts_near_the_dialects, texts_near_the_dialects, optional=True) for name in "abc"})


def texts_yaml(sep: str, quote: str, options: dict | None = None) -> str:
    return yaml.safe_dump(
        {
            "name": "csv_texts",
            "source": {
                "format": "csv",
                "path": "texts/*.csv",
                "max_record_bytes": 120,
                "options": options or {"header": True, "sep": sep, "quote": quote},
                "columns": {"a": "string", "b": "string", "c": "string"},
            },
            "target": {
                "table": "csv_texts",
                "quarantine_table": "quarantine_csv_texts",
                "columns": {name: {"type": "string"} for name in "abc"},
            },
        }
    )


@cache
def pipeline_and_plan(name: str) -> tuple[Pipeline, VectorPlan]:
    if name == "members":
        data = yaml.safe_load((REPO / "pipelines" / "rewards_members.yaml").read_text())
        data["source"]["max_record_bytes"] = MEMBERS_LIMIT
        config = PipelineConfig.model_validate(data)
    else:
        config = config_from(texts_yaml(*DIALECTS[name]))
    pipeline = Pipeline.from_config(config)
    return pipeline, compile_plan(pipeline)


def assert_plan_matches_reference(name: str, records: list[bytes | None]) -> list[dict]:
    return assert_matches(*pipeline_and_plan(name), records)


@EXAMPLES
@given(csv_batches(CSV_MEMBERS, MEMBERS_LIMIT))
def test_the_rewards_members_csv_pipeline_on_the_plan_equals_the_reference(records):
    assert_plan_matches_reference("members", records)


@pytest.mark.parametrize("dialect", list(DIALECTS))
@EXAMPLES
@given(data=st.data())
def test_csv_fields_read_as_the_reference_reads_them_in_any_dialect(dialect, data):
    sep, quote = DIALECTS[dialect]
    assert_plan_matches_reference(dialect, data.draw(csv_batches(TEXTS, 120, sep, quote)))


def test_quoting_rules_as_examples():
    rows = assert_plan_matches_reference(
        "comma",
        [b'a,"b,c",', b'"",,"x""y"', b" a , b ,c", b'a"b,c,d', b'"a"x,b,c', b'"a,b,c', b"a,b", b"a,b,c,d"],
    )
    assert [row["values"] for row in rows[:3]] == [
        {"a": "a", "b": "b,c", "c": None},  # a quoted separator; an empty plain field is null
        {"a": "", "b": None, "c": 'x"y'},  # a quoted empty field is the empty text; "" inside is one quote
        {"a": " a ", "b": " b ", "c": "c"},  # spaces belong to the field
    ]
    assert [[e["error_code"] for e in row["errors"]] for row in rows[3:]] == [["malformed_record"]] * 5
    assert rows[-1]["errors"][0]["message"] == "record is not a CSV line with 3 fields"


@pytest.mark.parametrize(
    "options", [{"sep": ",", "escape": "\\"}, {"sep": "::"}, {"sep": ",", "quote": ","}, {"nullValue": "NA"}]
)
def test_csv_options_without_a_vectorized_form_keep_the_pipeline_on_spark(options):
    pipeline = Pipeline.from_config(config_from(texts_yaml(",", '"', options)))
    with pytest.raises(NoSqlForm, match="CSV"):
        compile_plan(pipeline)
