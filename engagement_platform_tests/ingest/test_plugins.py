"""Plugins from another package, found through entry points: the example package in plugin_example/
is pip-installed (not editable, so the Spark server's Python workers import it from site-packages)
and a pipeline naming its plugins runs on the real Spark Connect server."""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from pyspark.sql.types import LongType, StringType

from engagement_platform.ingest.config import PipelineConfigError, load_pipeline
from engagement_platform.ingest.errors import ERROR_FIELDS, ERRORS, RAW, ROW_ID, SOURCE_OFFSET
from engagement_platform.ingest.pipeline import (
    Pipeline,
    QuarantineContext,
    errors_frame,
    quarantine_frame,
    split_result,
)
from engagement_platform.ingest.plugins import Converter, RowConverter, Validator
from engagement_platform.ingest.registry import CONVERTER_GROUP, VALIDATOR_GROUP, registry, resolve
from engagement_platform.ingest.sources import INPUT, read_file

PLUGIN_SOURCE = Path(__file__).resolve().parent / "plugin_example"
DIST = "ep-ingest-example"
PACKAGE = "ep_ingest_example"


def _declared_entry_points() -> set[tuple[str, str, str]]:
    groups = tomllib.loads((PLUGIN_SOURCE / "pyproject.toml").read_text())["project"]["entry-points"]
    return {(group, name, value) for group, eps in groups.items() for name, value in eps.items()}


def _installed_is_current() -> bool:
    """The installed distribution has the same entry points and module files as the source folder."""
    try:
        dist = importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    if {(ep.group, ep.name, ep.value) for ep in dist.entry_points} != _declared_entry_points():
        return False
    for source in (PLUGIN_SOURCE / PACKAGE).rglob("*.py"):
        installed = Path(dist.locate_file(source.relative_to(PLUGIN_SOURCE).as_posix()))
        if not installed.is_file() or installed.read_bytes() != source.read_bytes():
            return False
    return True


@pytest.fixture(scope="session")
def plugin_package(tmp_path_factory):
    """Install the example plugin package into this venv (skipped when the installed copy is current:
    other test runs may be using it on the shared Spark server). After changing the example's code,
    Python workers a kept stack reuses may still hold the old module: restart the stack then."""
    with open(Path(tempfile.gettempdir()) / "ep-ingest-example.install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test runs share the venv
        if not _installed_is_current():
            build = tmp_path_factory.mktemp("plugin_build") / "plugin_example"
            shutil.copytree(
                PLUGIN_SOURCE, build, ignore=shutil.ignore_patterns("__pycache__")
            )  # build outside the repo
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-deps",
                    "--no-build-isolation",
                    "--force-reinstall",
                    "--quiet",
                    str(build),
                ],
                check=True,
            )
    importlib.invalidate_caches()
    assert _installed_is_current()
    return DIST


# ---- the registry and load-time checks (no Spark) ------------------------------------------------


def test_the_registry_finds_the_plugins_of_the_installed_package(plugin_package):
    found = registry()
    assert {"phone_normalize", "loyalty_score", "nested_city", "tier_number"} <= set(found["converters"])
    assert "unique_in_batch" in found["validators"]
    assert {"rename", "cast", "required", "regex"} <= set(found["converters"]) | set(
        found["validators"]
    )  # built-ins still there
    phone, score, city = (resolve("converters", n) for n in ("phone_normalize", "loyalty_score", "nested_city"))
    unique = resolve("validators", "unique_in_batch")
    assert issubclass(phone, Converter) and not issubclass(phone, RowConverter)  # the DataFrame contract itself
    assert issubclass(score, RowConverter) and issubclass(city, RowConverter) and issubclass(unique, Validator)
    module = importlib.import_module(phone.__module__)
    assert "site-packages" in module.__file__  # the installed copy, which Spark's Python workers import too
    names = {(ep.group, ep.name) for ep in importlib.metadata.entry_points().select(group=CONVERTER_GROUP)}
    names |= {(ep.group, ep.name) for ep in importlib.metadata.entry_points().select(group=VALIDATOR_GROUP)}
    assert {(g, n) for g, n, _ in _declared_entry_points()} <= names


def _pipeline_yaml(converters: list[dict], validators: list[dict]) -> dict:
    return {
        "name": "loyalty_contacts",
        "source": {
            "format": "jsonl",
            "path": "loyalty/*.jsonl",
            "columns": {
                "id": "string",
                "tel": "string",
                "points": "string",
                "email": "string",
                "level": "string",
                "profile": "struct<address:struct<city:string>>",
            },
        },
        "target": {
            "table": "loyalty_contacts",
            "quarantine_table": "quarantine_loyalty_contacts",
            "columns": {
                "id": {"type": "long", "required": True},
                "phone": {"type": "string"},
                "score": {"type": "int", "max": 500},
                "city": {"type": "string"},
                "email": {"type": "string", "regex": "^[^@]+@[^@]+$"},
                "tier": {"type": "int"},
            },
        },
        "converters": converters,
        "validators": validators,
    }


CONVERTERS = [
    {"plugin": "rename", "from": "tel", "to": "phone"},  # a fused column converter before the DataFrame one
    {"plugin": "phone_normalize", "column": "phone"},
    {"plugin": "loyalty_score", "points": "points", "to": "score"},
    {"plugin": "nested_city", "column": "profile", "to": "city"},
    {"plugin": "tier_number", "column": "level", "to": "tier"},
]
VALIDATORS = [{"plugin": "unique_in_batch", "column": "email"}]


def write_yaml(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "loyalty_contacts.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_problems(path: Path) -> list[str]:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path)
    return str(info.value).splitlines()


def test_a_pipeline_naming_the_plugins_loads(plugin_package, tmp_path):
    config = load_pipeline(write_yaml(tmp_path, _pipeline_yaml(CONVERTERS, VALIDATORS)))
    pipeline = Pipeline.from_config(config)
    assert [type(c).__name__ for c in pipeline.converters] == [
        "Rename",
        "NormalizePhone",
        "LoyaltyScore",
        "NestedCity",
        "TierNumber",
    ]
    assert pipeline.converters[1].params.country_code == "1"


def test_plugin_params_and_the_plugins_own_checks_fail_at_load(plugin_package, tmp_path):
    converters = [*CONVERTERS[:1], {"plugin": "phone_normalize", "colum": "phone"}, {**CONVERTERS[2], "points": 3}]
    path = write_yaml(tmp_path, _pipeline_yaml(converters, [{"plugin": "unique_in_batch", "column": "nope"}]))
    lines = load_problems(path)
    assert f"{path}: converters[1].colum: unknown key" in lines
    assert f"{path}: converters[1].column: Field required" in lines
    assert any(line.startswith(f"{path}: converters[2].points: ") for line in lines)
    assert f"{path}: validators[0].column: 'nope' is not a target column" in lines  # the plugin's check_config


def test_a_broken_entry_point_only_hurts_the_pipelines_naming_it(plugin_package, tmp_path):
    path = write_yaml(
        tmp_path,
        _pipeline_yaml([*CONVERTERS, {"plugin": "example_missing_class"}], [{"plugin": "example_not_a_plugin"}]),
    )
    lines = load_problems(path)
    assert any(line.startswith(f"{path}: converters[5].plugin: ") and "DoesNotExist" in line for line in lines), lines
    assert any(
        line.startswith(f"{path}: validators[0].plugin: ")
        and "not a subclass of engagement_platform.ingest.plugins.Validator" in line
        for line in lines
    ), lines
    load_pipeline(write_yaml(tmp_path, _pipeline_yaml(CONVERTERS, VALIDATORS)))  # registered beside them: fine


# ---- a pipeline using them, on Spark -------------------------------------------------------------

RECORDS = [  # line -> record (level: gold unless said)
    {
        "id": "1",
        "tel": "(555) 123-4567",
        "points": "10",
        "email": "a@x.io",
        "profile": {"address": {"city": "  oslo "}},
    },
    {"id": "2", "tel": "12345", "points": "0", "email": "a@x.io", "profile": {}},  # bad phone: nothing after it runs
    {
        "id": "3",
        "tel": "1-555-000-1111",
        "points": "0",
        "email": "c@x.io",
        "profile": {"address": {"city": "rome"}},
    },  # ZeroDivisionError
    {
        "id": "4",
        "tel": None,
        "points": "abc",
        "email": "d@x.io",
        "profile": {"address": {"city": "bern"}},
    },  # ValueError
    {
        "id": "5",
        "tel": "5550001111",
        "points": "20",
        "email": "e@x.io",
        "profile": {"address": None},
    },  # nested field: TypeError
    {
        "id": "6",
        "tel": "555 000 2222",
        "points": "1",
        "email": "dup@x.io",
        "profile": {"address": {"city": "lima"}},
    },  # score 1000 > 500, duplicate
    {
        "id": "7",
        "tel": "555.000.3333",
        "points": "50",
        "email": "dup@x.io",
        "profile": {"address": {"city": "kyiv"}},
    },  # duplicate
    {
        "id": "x8",
        "tel": "555.000.4444",
        "points": "50",
        "email": "dup@x.io",
        "profile": {"address": {"city": "oslo"}},
    },  # conform fails
    {
        "id": "9",
        "tel": "555.000.5555",
        "points": "50",
        "email": "i@x.io",
        "profile": {"address": {"city": "oslo"}},
        "level": "platinum",
    },
]  # line 9: tier_number returns 'platinum' for its int output


@pytest.fixture(scope="module")
def loyalty(spark, plugin_package, tmp_path_factory):
    folder = tmp_path_factory.mktemp("loyalty")
    path = folder / "contacts.jsonl"
    path.write_text("".join(json.dumps({"level": "gold", **r}) + "\n" for r in RECORDS))
    config = load_pipeline(write_yaml(folder, _pipeline_yaml(CONVERTERS, VALIDATORS)))
    pipeline = Pipeline.from_config(config)
    parsed = read_file(spark, config.source, str(path))
    transformed = pipeline.transform(parsed)
    result = transformed.toArrow()
    return dict(
        path=path,
        config=config,
        pipeline=pipeline,
        parsed=parsed,
        transformed=transformed,
        result=result,
        rows={r[SOURCE_OFFSET]: r for r in result.to_pylist()},
    )


def errors_of(row) -> list[tuple]:
    return sorted((e["stage"], e["plugin"], e["column_name"], e["error_code"]) for e in row[ERRORS])


def test_the_plugins_convert_the_good_rows(loyalty):
    row = loyalty["rows"][1]
    assert row[ERRORS] == []
    assert (row["id"], row["phone"], row["score"], row["city"], row["email"], row["tier"]) == (
        1,
        "+15551234567",
        100,
        "Oslo",
        "a@x.io",
        3,
    )
    assert loyalty["rows"][7]["phone"] == "+15550003333"


def test_the_dataframe_converters_failed_rows_go_no_further(loyalty):
    row = loyalty["rows"][2]  # its points (0) would raise and its profile has no address: never reached
    assert errors_of(row) == [("convert", "phone_normalize", "phone", "bad_phone")]
    (err,) = row[ERRORS]
    assert err["value"] == "12345" and "'12345' is not a phone number" in err["message"]
    assert json.loads(row[RAW]) == {"level": "gold", **RECORDS[1]} and json.loads(row[INPUT])["tel"] == "12345"
    # the validator never saw it: row 1 shares its email and still is the only one with it
    assert loyalty["rows"][1][ERRORS] == []


def test_a_python_exception_on_one_row_is_that_rows_error(loyalty):
    rows = loyalty["rows"]
    for line, exception in (
        (3, "ZeroDivisionError: integer division or modulo by zero"),
        (4, "ValueError: invalid literal for int() with base 10: 'abc'"),
        (5, "TypeError: 'NoneType' object is not subscriptable"),
        (9, "TypeError: output 'tier' is 'platinum', not a int"),
    ):
        (err,) = rows[line][ERRORS]
        plugin = {5: "nested_city", 9: "tier_number"}.get(line, "loyalty_score")
        assert (err["stage"], err["plugin"], err["column_name"], err["error_code"]) == (
            "convert",
            plugin,
            None,
            "plugin_exception",
        )
        assert err["message"].startswith(exception) and "(at " in err["message"], err["message"]
    assert "(at convert_row:" in rows[3][ERRORS][0]["message"]  # where in the plugin's code
    assert rows[3]["score"] is None  # a failed row's outputs are null, the others convert
    assert [line for line, r in sorted(rows.items()) if r[ERRORS] == []] == [1]


def test_the_dataframe_validators_errors_join_back_with_the_other_validators(loyalty):
    rows = loyalty["rows"]
    assert errors_of(rows[6]) == [
        ("validate", "target_schema", "score", "out_of_range"),
        ("validate", "unique_in_batch", "email", "duplicate_in_batch"),
    ]
    assert errors_of(rows[7]) == [("validate", "unique_in_batch", "email", "duplicate_in_batch")]
    dup = next(e for e in rows[7][ERRORS] if e["plugin"] == "unique_in_batch")
    assert (
        dup["message"] == "'dup@x.io' appears 2 times in the batch" and dup["value"] == "dup@x.io"
    )  # line 8 never converted
    assert errors_of(rows[8]) == [("convert", "conform", "id", "wrong_type")]
    assert json.loads(rows[7][RAW]) == {"level": "gold", **RECORDS[6]}


def test_the_quarantine_joined_back_in_spark_equals_the_driver_split(loyalty):
    columns = loyalty["pipeline"].target_columns
    ctx = QuarantineContext("loyalty_contacts", 1, str(loyalty["path"]), datetime(2026, 1, 1, tzinfo=UTC))
    good, quarantine = split_result(loyalty["result"], columns, ctx)
    driver = sorted(
        (r["source_offset"], *(r[f] for f in ERROR_FIELDS), r["raw"], r["input"]) for r in quarantine.to_pylist()
    )
    joined = quarantine_frame(errors_frame(loyalty["transformed"]), loyalty["parsed"]).toArrow().to_pylist()
    spark_side = sorted((r[SOURCE_OFFSET], *(r[f] for f in ERROR_FIELDS), r[RAW], r[INPUT]) for r in joined)
    assert spark_side == driver
    assert good.num_rows + len({r[0] for r in driver}) == len(RECORDS)


def test_the_plugin_contracts_return_the_one_error_schema(loyalty):
    pipeline, parsed = loyalty["pipeline"], loyalty["parsed"]
    expected = [(ROW_ID, LongType()), *[(f, StringType()) for f in ERROR_FIELDS]]
    plugin_input = parsed.drop(ERRORS).withColumnRenamed("tel", "phone")
    converted, errors = pipeline.converters[1].convert(plugin_input)
    assert [(f.name, f.dataType) for f in errors.schema.fields] == expected
    assert converted.columns == plugin_input.columns
    validator = pipeline.validators[-1]
    assert type(validator).__name__ == "UniqueInBatch"
    assert [(f.name, f.dataType) for f in validator.validate(plugin_input).schema.fields] == expected
