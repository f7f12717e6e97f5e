"""Pipeline YAML checked at load time: every problem names the file, the key path and what is wrong."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from engagement_platform.ingest.config import PipelineConfigError, load_pipeline, load_pipelines
from engagement_platform.ingest.pipeline import Pipeline

REPO = Path(__file__).resolve().parents[2]
REWARDS = REPO / "pipelines" / "rewards_members.yaml"
ENGAGEMENT = REPO / "engagement_platform" / "engagement" / "ingestion" / "pipeline.yaml"


def rewards() -> dict:
    return yaml.safe_load(REWARDS.read_text())


def write(tmp_path: Path, data: dict | str, name: str = "pipeline.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def problems(path: Path) -> list[str]:
    """The lines of the load error; each must start with the file's path."""
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path)
    lines = [line for line in str(info.value).splitlines() if line.startswith(f"{path}: ")]
    assert lines, f"no line of the error names the file {path}: {info.value}"
    return lines


def changed(change) -> dict:
    data = rewards()
    change(data)
    return data


# ---- the shipped pipelines -----------------------------------------------------------------------


def test_shipped_pipelines_load_and_build():
    members, engagement = load_pipeline(REWARDS), load_pipeline(ENGAGEMENT)
    assert members.name == "rewards_members" and members.source.format == "csv"
    assert members.target.columns["birth_date"].formats is None  # formats belong to the cast converter here
    assert [c.plugin for c in members.converters] == ["rename", "split", "cast", "map_values"]
    assert engagement.source.format == "kafka" and engagement.target.partition_by == ["org_id"]
    for config in (members, engagement):
        pipeline = Pipeline.from_config(config)  # every plugin instantiates with its params
        assert len(pipeline.converters) == len(config.converters)
        assert pipeline.target_columns == list(config.target.columns)


def test_every_file_in_the_pipelines_folder_loads():
    configs = load_pipelines(REPO / "pipelines")
    assert "rewards_members" in [c.name for c in configs]


@pytest.mark.parametrize(
    "path", sorted((REPO / "engagement_platform").rglob("pipeline.yaml")), ids=lambda p: p.parent.name
)
def test_every_pipeline_shipped_in_the_package_loads(path):
    Pipeline.from_config(load_pipeline(path))


def test_pipeline_names_used_twice_are_rejected(tmp_path):
    write(tmp_path, rewards(), "a.yaml")
    write(tmp_path, rewards(), "b.yml")
    with pytest.raises(PipelineConfigError, match=r"pipeline names used twice: \['rewards_members'\]"):
        load_pipelines(tmp_path)


# ---- one problem: the file, the key path, the problem --------------------------------------------


def _append(kind: str, entry: dict):
    return lambda d: d.setdefault(kind, []).append(entry)


def _set(*path_and_value):
    *path, key, value = path_and_value

    def change(d):
        for p in path:
            d = d[p]
        d[key] = value

    return change


def _pop(*path):
    def change(d):
        for p in path[:-1]:
            d = d[p]
        d.pop(path[-1])

    return change


BAD = {
    # unknown keys, at every level
    "unknown top-level key": (_set("converter", []), "converter", "unknown key"),
    "unknown column key": (_set("target", "columns", "points", "maxx", 3), "target.columns.points.maxx", "unknown key"),
    "unknown source key": (_set("source", "delimiter", ";"), "source.delimiter", "unknown key"),
    # wrong types
    "required not a boolean": (
        _set("target", "columns", "points", "required", "perhaps"),
        "target.columns.points.required",
        "valid boolean",
    ),
    "size not an integer": (_set("source", "max_record_bytes", "big"), "source.max_record_bytes", "valid integer"),
    "converters not a list": (_set("converters", {"plugin": "rename"}), "converters", "valid list"),
    "columns missing": (_pop("target", "columns"), "target.columns", "Field required"),
    "unknown source format": (_set("source", "format", "xml"), "source.format", "'csv', 'json', 'jsonl' or 'kafka'"),
    "unknown target type": (
        _set("target", "columns", "points", "type", "integerz"),
        "target.columns.points.type",
        "unknown type 'integerz'",
    ),
    "error rate above 1": (
        _set("error_rate", "max_error_rate", 1.5),
        "error_rate.max_error_rate",
        "less than or equal to 1",
    ),
    "name not snake case": (_set("name", "Rewards Members"), "name", "must be lower_snake_case"),
    "kafka without topic": (_set("source", "format", "kafka"), "source", "a kafka source needs 'topic'"),
    "same table twice": (
        _set("target", "quarantine_table", "rewards_members"),
        "target",
        "table and quarantine_table must differ",
    ),
    # constraints that do not fit the column
    "bad regex": (
        _set("target", "columns", "email", "regex", "(["),
        "target.columns.email.regex",
        "regex does not compile",
    ),
    "enum on a non-string": (
        _set("target", "columns", "points", "enum", ["1", "2"]),
        "target.columns.points",
        "enum applies to string columns only",
    ),
    "min on a string": (
        _set("target", "columns", "email", "min", 3),
        "target.columns.email",
        "min/max apply to numeric, date and timestamp",
    ),
    "unknown datetime pattern letter": (
        _set("target", "columns", "birth_date", "formats", ["yyyy-MM-ddTHH"]),
        "target.columns.birth_date.formats",
        "format 'yyyy-MM-ddTHH' has letters that are not Spark datetime pattern letters: T",
    ),
    "week-based pattern in a plugin": (
        lambda d: d["converters"][2].update(formats=["MM/dd/yyyy", "YYYY-ww"]),
        "converters[2].formats",
        "not Spark datetime pattern letters: Y, w",
    ),
    "formats on a number": (
        _set("target", "columns", "points", "formats", ["yyyy"]),
        "target.columns.points",
        "formats apply to date and timestamp",
    ),
    "number bound on a date": (
        _set("target", "columns", "birth_date", "min", 1900),
        "target.columns.birth_date",
        "min: 1900.0 is not an ISO date",
    ),
    "text bound on a number": (
        _set("target", "columns", "points", "max", "lots"),
        "target.columns.points",
        "max: 'lots' is not a number",
    ),
    "partition_by not in target": (
        _set("target", "partition_by", ["nope"]),
        "target",
        "partition_by names columns not in the target schema: ['nope']",
    ),
    # plugins and their own parameters
    "unknown converter": (
        _append("converters", {"plugin": "frobnicate"}),
        "converters[4].plugin",
        "unknown converter 'frobnicate' (known: cast, coalesce",
    ),
    "unknown validator": (
        _append("validators", {"plugin": "is_nice", "column": "email"}),
        "validators[2].plugin",
        "unknown validator 'is_nice'",
    ),
    "plugin param missing": (lambda d: d["converters"][2].pop("type"), "converters[2].type", "Field required"),
    "unknown plugin param": (lambda d: d["converters"][0].update(too="x"), "converters[0].too", "unknown key"),
    "plugin param wrong type": (
        lambda d: d["converters"][1].update(into="first_name"),
        "converters[1].into",
        "valid list",
    ),
    "plugin type unknown": (
        lambda d: d["converters"][2].update(type="dat"),
        "converters[2].type",
        "unknown type 'dat'",
    ),
    "plugin regex bad": (
        lambda d: d["validators"][1].update(pattern="(["),
        "validators[1].pattern",
        "regex does not compile",
    ),
    "range without bounds": (
        _append("validators", {"plugin": "range", "column": "points"}),
        "validators[2]",
        "give min, max or both",
    ),
    "range bound of the wrong kind": (
        _append("validators", {"plugin": "range", "column": "birth_date", "max": 5}),
        "validators[2].max",
        "5.0 is not an ISO date",
    ),
    # the suppression section (records that name people)
    "suppression with two scopes": (
        _set(
            "suppression",
            {
                "list_table": "engagement_erased_subjects",
                "subject_columns": ["email"],
                "scope": "o",
                "scope_column": "email",
            },
        ),
        "suppression",
        "give exactly one of scope_column",
    ),
    "suppression of a column not in the target": (
        _set("suppression", {"list_table": "engagement_erased_subjects", "subject_columns": ["mail"], "scope": "o"}),
        "(top level)",
        "suppression names columns not in the target schema: ['mail']",
    ),
    "suppression list not a list table": (
        _set("suppression", {"list_table": "gdpr_audit", "subject_columns": ["email"], "scope": "o"}),
        "suppression",
        "must be a suppression list table",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_pipeline_file_names_the_file_the_key_and_the_problem(tmp_path, case):
    change, key, problem = BAD[case]
    path = write(tmp_path, changed(change))
    lines = problems(path)
    assert any(line.startswith(f"{path}: {key}: ") and problem in line for line in lines), lines


def _message(path: Path) -> str:
    with pytest.raises(PipelineConfigError) as info:
        load_pipeline(path)
    return str(info.value)


def test_yaml_syntax_error_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, "name: rewards\nsource: {format: csv\ntarget: x\n")
    message = _message(path)
    assert message.startswith(f"{path}: not valid YAML: ")
    assert "line 2, column 9" in message  # where the unclosed mapping starts


@pytest.mark.parametrize("text", ["", "- a list\n- of things\n", "just text\n"])
def test_a_file_that_is_not_a_mapping_is_rejected(tmp_path, text):
    path = write(tmp_path, text)
    assert "top level must be a mapping" in _message(path)


def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "nope.yaml"
    assert _message(path) == f"{path}: file not found"


# ---- several problems at once --------------------------------------------------------------------


def test_several_schema_problems_are_reported_at_once(tmp_path):
    def change(d):
        d["name"] = "Bad Name"
        d["source"]["format"] = "xml"
        d["target"]["columns"]["points"]["maxx"] = 3
        d["target"]["columns"]["email"]["regex"] = "(["

    path = write(tmp_path, changed(change))
    keys = {line.split(": ")[1] for line in problems(path)}
    assert keys == {"name", "source.format", "target.columns.points.maxx", "target.columns.email.regex"}


def test_several_plugin_problems_are_reported_at_once(tmp_path):
    def change(d):
        d["converters"][0]["too"] = "x"
        d["converters"][2]["type"] = "dat"
        d["converters"].append({"plugin": "frobnicate"})
        d["validators"][1]["pattern"] = "(["

    path = write(tmp_path, changed(change))
    keys = {line.split(": ")[1] for line in problems(path)}
    assert keys == {"converters[0].too", "converters[2].type", "converters[4].plugin", "validators[1].pattern"}


def test_unknown_plugins_are_reported_with_the_schema_problems(tmp_path):
    def change(d):
        d["target"]["columns"]["points"]["maxx"] = 3
        d["validators"].append({"plugin": "is_nice"})

    path = write(tmp_path, changed(change))
    keys = {line.split(": ")[1] for line in problems(path)}
    assert keys == {"target.columns.points.maxx", "validators[2].plugin"}


def test_the_checked_config_is_what_the_file_says(tmp_path):
    data = rewards()
    data["target"]["columns"]["points"]["max"] = 10
    config = load_pipeline(write(tmp_path, copy.deepcopy(data)))
    assert config.target.columns["points"].max == 10
    assert config.converters[0].params == {"from": "id", "to": "member_id"}
    assert config.error_rate.max_error_rate == 0.10 and config.error_rate.severity == "warn"
