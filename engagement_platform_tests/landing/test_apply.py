"""A landing file through the batch lifecycle into real Delta tables: the target table and the
quarantine table hold exactly the expected rows, once, however often the batch runs."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pytest
import yaml

from engagement_platform.ingest.config import SuppressionSpec, load_pipeline
from engagement_platform.ingest.pipeline import Pipeline
from engagement_platform.ingest.record_tasks import SPARK, VECTORIZED, validate_lines_file
from engagement_platform.lake.delta import BatchTxn
from engagement_platform.lake.file_writes import filesystem
from engagement_platform.lake.suppression import subject_hash
from engagement_platform.lake.suppression_tables import erased_subjects_spec
from engagement_platform.landing.apply import DATA_FILES, app_id, file_plan, files_plan, run_file_batch, stream_name
from engagement_platform.landing.checks import evaluate_pipeline_checks
from engagement_platform.landing.retention import expire_landed_files, expired_landed_files
from engagement_platform.settings import load_settings
from engagement_platform_tests.support.crash import crash_then_rerun, finished, killed_at

REPO = Path(__file__).resolve().parents[2]
MAX_RECORD_BYTES = 120

LINES = [
    "id,name,bday,level,email,points",  # 1: header
    "1,Ann Lee,01/02/1990,G,ann@example.com,10",  # 2: good
    "2,Bob Ray,1985-03-04,silver,bob@example.com,20",  # 3: good
    '3,"Unclosed, quote',  # 4: does not parse
    "4," + "A" * MAX_RECORD_BYTES + " Long,1990-01-01,G,l@example.com,1",  # 5: oversized
    "5,Dan Q,13/45/1990,G,dan@example.com,3",  # 6: a converter fails (cast)
    "6,Eve Ng,1990-01-01,G,eve@example.com,many",  # 7: the conform step fails
    "7,Fay Oh,1990-01-01,gold,fay-at-example,3",  # 8: one validation error
    "8,J0hn Doe,1800-01-01,gold,,-5",  # 9: four validation errors at once
    "",  # 10: blank
    "9,Gus Li,2000-12-31,S,gus@example.com,1000000",  # 11: good
]
GOOD = [
    dict(
        member_id=1,
        first_name="Ann",
        last_name="Lee",
        birth_date=date(1990, 1, 2),
        rewards_level="gold",
        email="ann@example.com",
        points=10,
    ),
    dict(
        member_id=2,
        first_name="Bob",
        last_name="Ray",
        birth_date=date(1985, 3, 4),
        rewards_level="silver",
        email="bob@example.com",
        points=20,
    ),
    dict(
        member_id=9,
        first_name="Gus",
        last_name="Li",
        birth_date=date(2000, 12, 31),
        rewards_level="silver",
        email="gus@example.com",
        points=1000000,
    ),
]
ERRORS = {  # line -> sorted (stage, plugin, column_name, error_code, message)
    4: [("parse", "parser", None, "malformed_record", "record is not a CSV line with 6 fields")],
    5: [("parse", "parser", None, "oversized", f"record is {len(LINES[4])} bytes, limit {MAX_RECORD_BYTES}")],
    6: [
        ("convert", "cast", "bday", "wrong_type", "'13/45/1990' is not a valid date (formats: MM/dd/yyyy, yyyy-MM-dd)")
    ],
    7: [("convert", "conform", "points", "wrong_type", "'many' is not a valid int")],
    8: [
        (
            "validate",
            "target_schema",
            "email",
            "pattern_mismatch",
            "'fay-at-example' does not match ^[^@\\s]+@[^@\\s]+\\.[a-z]+$",
        )
    ],
    9: sorted(
        [
            ("validate", "required", "email", "missing_required", "required field 'email' is missing or empty"),
            ("validate", "regex", "first_name", "pattern_mismatch", "'J0hn' does not match ^[A-Za-z' -]+$"),
            ("validate", "target_schema", "birth_date", "out_of_range", "1800-01-01 is outside [1900-01-01, ]"),
            ("validate", "target_schema", "points", "out_of_range", "-5 is outside [0, 1000000]"),
        ]
    ),
}
INPUTS = {  # line -> the parsed input columns the quarantine shows
    4: None,  # does not parse: the raw bytes are the record
    5: None,  # too big to parse
    6: dict(id="5", name="Dan Q", bday="13/45/1990", level="G", email="dan@example.com", points="3"),
    9: dict(id="8", name="J0hn Doe", bday="1800-01-01", level="gold", email=None, points="-5"),
}


@pytest.fixture
def members(tmp_path):
    data = yaml.safe_load((REPO / "pipelines" / "rewards_members.yaml").read_text())
    data["source"]["max_record_bytes"] = MAX_RECORD_BYTES
    config_path = tmp_path / "rewards_members.yaml"
    config_path.write_text(yaml.safe_dump(data, sort_keys=False))  # CSV columns are positional
    landing = tmp_path / "landing" / "rewards_members"
    landing.mkdir(parents=True)
    path = landing / "store_1.csv"
    path.write_text("\n".join(LINES) + "\n")
    return load_pipeline(config_path), path


def test_a_file_mixing_every_kind_of_bad_row_lands_exactly_once(spark, lake, checkpoints, members):
    config, path = members
    plan = file_plan(config, 1, str(path), path.stat().st_size)
    assert checkpoints.record_plan(plan)
    result = run_file_batch(spark, lake, checkpoints, config, plan)

    # the batch's counts
    assert (result.records_read, result.rows_written, result.rows_rejected, result.errors) == (9, 3, 6, 9)
    assert result.errors_by_code == {
        "malformed_record": 1,
        "oversized": 1,
        "wrong_type": 2,
        "pattern_mismatch": 2,
        "missing_required": 1,
        "out_of_range": 2,
    }
    assert result.error_rate == pytest.approx(6 / 9)
    assert checkpoints.is_done(stream_name(config), 1)

    # the target table: the good rows, typed, stamped with the batch
    target = lake.read(config.target.table).sort_by("member_id").to_pylist()
    assert [{k: r[k] for k in GOOD[0]} for r in target] == GOOD
    assert {r["batch_id"] for r in target} == {1} and all(r["ingested_at"] for r in target)

    # the quarantine table: one row per error, with the raw line, the input as JSON, file:line and the reason
    quarantine = lake.read(config.target.quarantine_table).to_pylist()
    by_line: dict[int, list[dict]] = {}
    for row in quarantine:
        by_line.setdefault(row["source_offset"], []).append(row)
    assert {
        line: sorted((r["stage"], r["plugin"], r["column_name"], r["error_code"], r["message"]) for r in rows)
        for line, rows in by_line.items()
    } == ERRORS
    for line, rows in by_line.items():
        for row in rows:
            assert row["row_id"] == f"{path}:{line}"
            assert row["raw"] == LINES[line - 1].encode()
            assert row["pipeline"] == "rewards_members" and row["batch_id"] == 1 and row["source"] == str(path)
            assert row["source_partition"] == 0 and row["org_id"] is None
            assert row["quarantine_date"] == row["quarantined_at"].date() and row["quarantined_at"] <= datetime.now(UTC)
        if line in INPUTS:
            shown = {json.dumps(json.loads(r["input"]) if r["input"] else None, sort_keys=True) for r in rows}
            assert shown == {json.dumps(INPUTS[line], sort_keys=True)}, (line, rows[0]["input"])
    (oversized,) = by_line[5]
    assert oversized["value"] is None and len(oversized["raw"]) > MAX_RECORD_BYTES
    assert by_line[4][0]["value"] == LINES[3]
    assert {r["value"] for r in by_line[9]} == {None, "J0hn", "1800-01-01", "-5"}

    # the same plan again (a retried run): nothing is written twice
    versions = {name: lake.table(name).version() for name in (config.target.table, config.target.quarantine_table)}
    assert set(result.versions.values()) == set(versions.values()) and None not in versions.values()
    again = run_file_batch(spark, lake, checkpoints, config, plan)
    assert again.versions == {config.target.table: None, config.target.quarantine_table: None}
    assert (again.rows_written, again.errors) == (3, 9)  # computed the same, committed nowhere
    for name, version in versions.items():
        assert lake.table(name).version() == version
        assert lake.committed_version(name, app_id(config)) == 1
    assert lake.read(config.target.table).num_rows == 3 and lake.read(config.target.quarantine_table).num_rows == 9

    # a second file is the next batch: it appends, and its txn version moves on
    second = path.with_name("store_2.csv")
    second.write_text(LINES[0] + "\n" + LINES[1].replace("1,Ann", "10,Ann") + "\n" + LINES[5] + "\n")
    batch2 = run_file_batch(spark, lake, checkpoints, config, file_plan(config, 2, str(second), second.stat().st_size))
    assert (batch2.rows_written, batch2.errors) == (1, 1)
    assert lake.committed_version(config.target.table, app_id(config)) == 2
    quarantine = lake.read(config.target.quarantine_table)
    assert pc.sum(pc.equal(quarantine["batch_id"], 2)).as_py() == 1
    assert quarantine.filter(pc.equal(quarantine["batch_id"], 2))["row_id"].to_pylist() == [f"{second}:3"]


def test_a_backlog_of_files_is_one_batch_and_each_file_is_checked_on_its_own(spark, lake, checkpoints, members):
    """Three files waiting together: one batch, one commit per table; every row and error keeps its own file;
    the error-rate check fails for the one bad file although the batch's rate is under the bound."""
    config, path = members
    good_lines = [f"{100 + i},Ann Lee,01/02/1990,G,a{i}@example.com,{i}" for i in range(80)]
    first, third = path.with_name("a_store.csv"), path.with_name("c_store.csv")
    first.write_text("\n".join([LINES[0], *good_lines[:40]]) + "\n")
    third.write_text("\n".join([LINES[0], *good_lines[40:]]) + "\n")
    empty = path.with_name("b_store.csv")
    empty.write_text(LINES[0] + "\n")  # a header alone: no records, and a result with no rows
    files = [first, empty, path, third]  # path (store_1.csv) holds 6 bad records of 9
    plan = files_plan(config, 1, [(str(f), f.stat().st_size) for f in files])
    assert checkpoints.record_plan(plan) and checkpoints.plan(stream_name(config), 1) == plan
    result = run_file_batch(spark, lake, checkpoints, config, plan)

    assert (result.records_read, result.rows_written, result.rows_rejected) == (89, 83, 6)
    assert [(f.path, f.records_read, f.records_rejected) for f in result.files] == [
        (str(first), 40, 0),
        (str(empty), 0, 0),
        (str(path), 9, 6),
        (str(third), 40, 0),
    ]
    target = lake.read(config.target.table)
    assert sorted(target["member_id"].to_pylist()) == sorted([1, 2, 9, *range(100, 180)]) and set(
        target["batch_id"].to_pylist()
    ) == {1}
    quarantine = lake.read(config.target.quarantine_table).to_pylist()
    assert {r["source"] for r in quarantine} == {str(path)} and {r["row_id"] for r in quarantine} == {
        f"{path}:{line}" for line in ERRORS
    }
    assert lake.table(config.target.table).version() == result.versions[config.target.table] == 1, (
        "created, then one append for 4 files"
    )

    checks = {c.check_name: c for c in evaluate_pipeline_checks(lake, config, result)}
    assert checks["records_conserved"].passed
    rate = checks["error_rate_under_threshold"]
    assert rate.metadata["error_rate"].value == round(6 / 89, 6) and rate.metadata["files"].value == 4
    assert rate.metadata["worst_file"].value == str(path) and rate.metadata["worst_file_error_rate"].value == round(
        6 / 9, 6
    )
    assert 6 / 89 <= config.error_rate.max_error_rate and not rate.passed, (
        "the bad file fails the check under a good average"
    )

    # A file of the set that changed is refused before anything is read; the batch re-run commits nothing twice.
    again = run_file_batch(spark, lake, checkpoints, config, plan)
    assert again.versions == {config.target.table: None, config.target.quarantine_table: None}
    third.write_text(third.read_text() + "999,Late Row,1990-01-01,G,late@example.com,1\n")
    with pytest.raises(RuntimeError, match=f"{third} changed since it was planned"):
        run_file_batch(spark, lake, checkpoints, config, plan)


def test_a_file_that_changed_since_it_was_planned_is_refused(spark, lake, checkpoints, members):
    config, path = members
    plan = file_plan(config, 1, str(path), path.stat().st_size)
    with path.open("a") as f:
        f.write("10,Late Row,1990-01-01,G,late@example.com,1\n")  # still being written when the batch runs
    with pytest.raises(
        RuntimeError, match=r"changed since it was planned \(\d+ bytes then, \d+ now\).*write elsewhere, then rename"
    ):
        run_file_batch(spark, lake, checkpoints, config, plan)
    assert not lake.exists(config.target.table) and not lake.exists(config.target.quarantine_table)
    assert not checkpoints.is_done(stream_name(config), 1)


def test_a_pipeline_naming_people_drops_the_records_of_erased_subjects_and_counts_them(
    spark, lake, checkpoints, members, tmp_path
):
    config, path = members
    org, secret = "00D000001", load_settings().erasure.secret
    config = config.model_copy(
        update={
            "suppression": SuppressionSpec(
                list_table="engagement_erased_subjects", scope=org, subject_columns=["member_id", "email"]
            )
        }
    )
    erased = erased_subjects_spec("engagement_erased_subjects", "org_id")
    rows = [
        dict(
            org_id=org,
            subject_hash=subject_hash(secret, org, sid),
            request_id=f"e{i}",
            erased_at=datetime.now(UTC),
            batch_id=1,
        )
        for i, sid in enumerate(["2", "gus@example.com", "dan@example.com"])
    ]
    lake.append(erased, pa.Table.from_pylist(rows, schema=erased.schema), BatchTxn("test.erasure", 1))
    plan = file_plan(config, 1, str(path), path.stat().st_size)
    assert checkpoints.record_plan(plan)
    result = run_file_batch(spark, lake, checkpoints, config, plan)

    assert (result.records_read, result.rows_written, result.rows_rejected, result.records_suppressed) == (9, 1, 5, 3)
    assert lake.read(config.target.table)["member_id"].to_pylist() == [1]
    quarantined = lake.read(config.target.quarantine_table)
    assert "dan@example.com" not in json.dumps(quarantined.to_pylist(), default=str), (
        "a rejected record naming a subject is not kept"
    )
    counts = lake.read("engagement_suppressed_records").to_pylist()
    assert sum(r["records"] for r in counts) == 3 and {r["stream"] for r in counts} == {stream_name(config)}
    checks = {c.check_name: c for c in evaluate_pipeline_checks(lake, config, result)}
    assert checks["records_conserved"].passed and checks["records_conserved"].metadata["records_suppressed"].value == 3


def test_landed_files_leave_once_ingested_and_older_than_half_the_erasure_window(spark, lake, checkpoints, members):
    config, path = members
    waiting = path.with_name("store_9.csv")
    waiting.write_text(LINES[0] + "\n" + LINES[1] + "\n")  # landed, not planned yet: it stays
    plan = file_plan(config, 1, str(path), path.stat().st_size)
    assert checkpoints.record_plan(plan)
    assert expired_landed_files(str(path.parent.parent), config, checkpoints, timedelta(seconds=0)) == [], (
        "its batch is not done yet"
    )
    run_file_batch(spark, lake, checkpoints, config, plan)
    assert expired_landed_files(str(path.parent.parent), config, checkpoints, timedelta(hours=1)) == [], (
        "younger than the retention"
    )
    deleted = expire_landed_files(str(path.parent.parent), [config], checkpoints, timedelta(seconds=0))
    assert deleted == [str(path)] and not path.exists() and waiting.exists()


def data_files(lake, table: str) -> list[str]:
    """The Parquet files in a table's folder, committed or not."""
    fs, root = filesystem(lake.uri(table), lake.storage_options)
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return [i.path for i in found if i.is_file and i.path.endswith(".parquet") and "/_delta_log/" not in i.path]


@pytest.mark.lake_stores("local", "s3")  # exactly-once on an object store too
@pytest.mark.parametrize("crash_after", [DATA_FILES, "target", "quarantine"])
def test_a_landing_batch_killed_after_a_commit_then_rerun_is_exactly_once(
    spark, stack, lake, lake_root, checkpoints, tmp_path, crash_after
):
    """The CLI runs the planned file in a child process killed right after the tasks wrote the target's files
    or right after one table's commit; the re-run commits only what is missing (the dead attempt's files
    deleted): every good row once, every rejected line's errors once, counts balanced."""
    config = load_pipeline(REPO / "pipelines" / "rewards_members.yaml")  # the shipped pipeline the CLI finds
    path = tmp_path / "store_1.csv"
    path.write_text("\n".join(LINES) + "\n")
    plan = file_plan(config, 1, str(path), path.stat().st_size)
    assert checkpoints.record_plan(plan)
    if crash_after == DATA_FILES:
        killed_at(stream_name(config), lake_root, 1, DATA_FILES)
        assert data_files(lake, config.target.table)  # written by the dead attempt's tasks
        assert lake.committed_version(config.target.table, app_id(config)) is None
        rerun = finished(stream_name(config), lake_root, 1)
        assert len(data_files(lake, config.target.table)) == len(lake.table(config.target.table).file_uris())
    else:
        table = config.target.table if crash_after == "target" else config.target.quarantine_table
        rerun = crash_then_rerun(lake_root, lake, checkpoints, stream_name(config), app_id(config), 1, table)
    figures = json.loads(rerun.stdout.strip().splitlines()[-1])
    target, quarantine = (
        lake.read(config.target.table).to_pylist(),
        lake.read(config.target.quarantine_table).to_pylist(),
    )
    assert sorted(r["member_id"] for r in target) == [1, 2, 4, 9]  # line 5 fits the shipped record limit
    lines = {r["source_offset"] for r in quarantine}
    assert figures["records_read"] == 9 == len(target) + len(lines) and figures["errors"] == len(quarantine)
    assert len({(r["row_id"], r["column_name"], r["error_code"]) for r in quarantine}) == len(
        quarantine
    )  # no error twice
    for name in (config.target.table, config.target.quarantine_table):
        assert lake.committed_version(name, app_id(config)) == 1


def test_a_config_that_gains_a_column_keeps_writing_to_its_table_and_a_type_change_is_refused(
    spark, lake, checkpoints, members, tmp_path
):
    """Schema evolution end to end: the pipeline's target table takes the config's new column (earlier rows read
    null, in deltalake and in DuckDB); a config that changes a column's type is refused before anything is written,
    naming the pipeline, the column and the table, and its batch stays unfinished."""
    from engagement_platform.lake.schema_evolution import SchemaChangeError
    from engagement_platform_tests.support.duckdb_reader import read_delta

    config, path = members
    first = file_plan(config, 1, str(path), path.stat().st_size)
    assert checkpoints.record_plan(first)
    run_file_batch(spark, lake, checkpoints, config, first)

    def planned(data: dict, batch_id: int, row: str) -> tuple:
        """The pipeline as `data` says, and a recorded plan of a new landed file holding `row`."""
        config_file = tmp_path / f"config-{batch_id}.yaml"
        config_file.write_text(yaml.safe_dump(data, sort_keys=False))
        config = load_pipeline(config_file)
        landed = path.with_name(f"store_{batch_id}.csv")
        landed.write_text(LINES[0] + "\n" + row + "\n")
        plan = file_plan(config, batch_id, str(landed), landed.stat().st_size)
        assert checkpoints.record_plan(plan)
        return config, plan

    data = yaml.safe_load((tmp_path / "rewards_members.yaml").read_text())
    data["target"]["columns"]["greeting"] = {"type": "string"}
    data["converters"].append({"plugin": "concat", "columns": ["first_name", "email"], "to": "greeting"})
    config, second = planned(data, 2, "10,Hal Po,1990-01-01,G,hal@example.com,5")
    assert run_file_batch(spark, lake, checkpoints, config, second).rows_written == 1

    expected = [(1, None), (2, None), (9, None), (10, "Hal hal@example.com")]
    table = lake.read(config.target.table).sort_by("member_id")
    assert list(zip(table["member_id"].to_pylist(), table["greeting"].to_pylist())) == expected
    by_duckdb = read_delta(lake.uri(config.target.table), ["member_id", "greeting"])
    assert list(zip(by_duckdb["member_id"].to_pylist(), by_duckdb["greeting"].to_pylist())) == expected

    data["target"]["columns"]["points"]["type"] = "long"
    config, third = planned(data, 3, "11,Ida Wu,1990-01-01,G,ida@example.com,7")
    version = lake.table(config.target.table).version()
    with pytest.raises(SchemaChangeError, match="^pipeline rewards_members: table 'rewards_members'") as refused:
        run_file_batch(spark, lake, checkpoints, config, third)
    assert "column 'points' is integer in the table and long in the config" in str(refused.value)
    assert lake.table(config.target.table).version() == version and not checkpoints.is_done(stream_name(config), 3)


def test_a_json_lines_file_runs_on_the_vectorized_path_with_the_csv_files_rows_and_reasons(
    spark, lake, checkpoints, tmp_path
):
    """The rewards-members records as JSON lines: parsed and checked by the DuckDB plan in the tasks, the same
    typed rows and the same reasons as the CSV file's."""
    data = yaml.safe_load((REPO / "pipelines" / "rewards_members.yaml").read_text())
    data["source"] = {**data["source"], "format": "jsonl", "path": "members/*.jsonl", "options": {}}
    config_path = tmp_path / "members_jsonl.yaml"
    config_path.write_text(yaml.safe_dump(data, sort_keys=False))
    config = load_pipeline(config_path)
    names = ["id", "name", "bday", "level", "email", "points"]
    csv_lines = [LINES[i] for i in (1, 2, 5, 6, 7, 8, 10)]  # every CSV line that parses (as numbered in ERRORS)
    # an empty CSV field reads as null: the JSON records leave such keys out
    records = [{k: v for k, v in zip(names, line.split(",")) if v} for line in csv_lines]
    lines = [json.dumps(r) for r in records] + ['{"id": "3", "name": ', "[1]"]
    path = tmp_path / "members.jsonl"
    path.write_text("\n".join(lines) + "\n")
    plan = file_plan(config, 1, str(path), path.stat().st_size)
    assert checkpoints.record_plan(plan)
    result = run_file_batch(spark, lake, checkpoints, config, plan)

    assert result.record_path == "vectorized"
    target = lake.read(config.target.table).sort_by("member_id").to_pylist()
    assert [{k: r[k] for k in GOOD[0]} for r in target] == GOOD
    quarantine = lake.read(config.target.quarantine_table).to_pylist()
    by_line: dict[int, list] = {}
    for r in quarantine:
        by_line.setdefault(r["source_offset"], []).append(
            (r["stage"], r["plugin"], r["column_name"], r["error_code"], r["message"])
        )
    malformed = [("parse", "parser", None, "malformed_record", "record is not one JSON object")]
    assert {line: sorted(found) for line, found in by_line.items()} == {
        3: ERRORS[6],
        4: ERRORS[7],
        5: ERRORS[8],
        6: ERRORS[9],
        8: malformed,
        9: malformed,
    }
    assert {r["source_offset"]: r["raw"] for r in quarantine}[8] == lines[7].encode()


def validated_rows(spark, pipeline: Pipeline, path: Path, wanted: str) -> tuple[list[dict], str]:
    """(a file's validated rows in source order, the record path): a rejected row as its position, errors
    and raw bytes only (its values go nowhere but the quarantine's input, which the paths show differently)."""
    result, taken = validate_lines_file(spark, pipeline, str(path), wanted=wanted)
    if result.num_columns == 0:
        return [], taken
    found = sorted(result.drop_columns(["_input"]).to_pylist(), key=lambda r: r["_row_id"])
    kept = ("_row_id", "_source_partition", "_source_offset", "_errors", "_raw")
    return [r if not r["_errors"] else {k: r[k] for k in kept} for r in found], taken


def test_a_csv_file_gives_the_same_rows_and_reasons_on_the_vectorized_and_the_spark_path(spark, members, tmp_path):
    """The DuckDB plan's CSV parse against Spark's from_csv, on lines where their rules agree (quoted separators,
    spaces kept, empty fields null) and on every bad kind of the members file. They differ only in what a line
    that does not parse shows: nothing on the vectorized path (its raw bytes are the record), the fields Spark
    made of it on the other (a rejected row's values go nowhere but the quarantine's input)."""
    config, _ = members
    lines = [
        *LINES,
        '10,"Lee, Ann",01/02/1990,G,ann@example.com,10',  # a quoted separator
        "11, Kim Bo ,1990-01-01,B,kim@example.com,0",  # spaces are part of a plain field
        "12,Ola Ek,,S,ola@example.com,",  # empty fields read as null
        '13,"Una Ba",1990-01-01,"G",una@example.com,"7"',  # quoted plain values
        "14,Vic Ro,1990-01-01,G,vic@example.com,1,extra",  # one field too many
    ]
    path = tmp_path / "both_paths.csv"
    path.write_text("\n".join(lines) + "\n")
    pipeline = Pipeline.from_config(config)

    vectorized, taken = validated_rows(spark, pipeline, path, VECTORIZED)
    on_spark, spark_taken = validated_rows(spark, pipeline, path, SPARK)
    assert (taken, spark_taken) == ("vectorized", "spark")
    assert len(vectorized) == len(lines) - 2  # the header and the blank line are not records
    assert vectorized == on_spark
    reasons = {r["_source_offset"]: [e["error_code"] for e in r["_errors"]] for r in vectorized if r["_errors"]}
    assert reasons[4] == reasons[len(lines)] == ["malformed_record"]
    assert [r["member_id"] for r in vectorized if not r["_errors"]] == [1, 2, 9, 11, 12, 13]  # 10: "Lee," is no name


@pytest.mark.parametrize(
    "document",
    [
        '[{"id": "1", "name": "Ann Lee", "email": "a@x.io", "points": "7"}, {"id": "x"}, 3, {"id": "4", "name": "Bo"}]',
        '  {"id": "5", "name": "Cy Dee", "email": "c@x.io"}\n',
        '[{"id": "9", ',  # not JSON: one record, its whole text
        "[]",
    ],
)
def test_a_json_document_gives_the_same_rows_and_reasons_on_the_vectorized_and_the_spark_path(
    spark, tmp_path, document
):
    """A whole-document JSON landing file: its elements are records (offset: the element's index) on both
    paths, and a document that is not JSON is one rejected record with its whole text."""
    data = yaml.safe_load((REPO / "pipelines" / "rewards_members.yaml").read_text())
    data["source"] = {**data["source"], "format": "json", "path": "members/*.json", "options": {}}
    config_path = tmp_path / "members_json.yaml"
    config_path.write_text(yaml.safe_dump(data, sort_keys=False))
    pipeline = Pipeline.from_config(load_pipeline(config_path))
    path = tmp_path / "members.json"
    path.write_text(document)

    vectorized, taken = validated_rows(spark, pipeline, path, VECTORIZED)
    on_spark, spark_taken = validated_rows(spark, pipeline, path, SPARK)
    assert (taken, spark_taken) == ("vectorized", "spark")
    assert vectorized == on_spark
    if document.startswith('[{"id": "9"'):
        (broken,) = vectorized
        assert broken["_raw"] == document.encode() and broken["_errors"][0]["message"] == "document is not valid JSON"
