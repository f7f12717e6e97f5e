"""The cluster tier's own premise, checked on the real standalone cluster (scripts/run_cluster_tests.sh): a batch's
tasks run in executors of both workers, none on the driver, and an executor shares neither the driver's environment
nor its folders, so a batch that passes here reaches the lake only through its URL and the options the tasks carry."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from engagement_platform.engagement.ingestion.apply import STREAM, ingest_batch
from engagement_platform.engagement.tables import ENGAGEMENT_ACTIVITY
from engagement_platform.streams.planning import plan_next_batch
from engagement_platform_tests.support.activities import produce_activities
from engagement_platform_tests.support.stack import PORTS, STATE

pytestmark = pytest.mark.cluster

WORKERS = ("spark-worker-1", "spark-worker-2")
# What the platform's processes export (settings, the lake's credentials, the run's test secrets): none of it may
# reach an executor, or a batch could pass here by reading what only the driver has.
DRIVER_ONLY = ("EP_", "AWS_", "AZURE_", "KAFKA_", "ZOOKEEPER_", "SPARK_REMOTE", "DAGSTER_")


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def tasks_per_worker() -> Counter:
    """Tasks each worker's executors of the Connect application have run so far (the application UI's REST API
    counts them per executor; each worker's own page names its executors)."""
    ui = f"http://127.0.0.1:{PORTS['EP_SPARK_UI_PORT']}/api/v1/applications"
    (app,) = get_json(ui)
    counts = {e["id"]: e["totalTasks"] for e in get_json(f"{ui}/{app['id']}/allexecutors")}
    per_worker = Counter()
    for worker, port in zip(WORKERS, PORTS["EP_SPARK_WORKER_UI_PORTS"].split()):
        for executor in get_json(f"http://127.0.0.1:{port}/json/")["executors"]:
            if executor["appid"] == app["id"]:
                per_worker[worker] += counts.get(str(executor["id"]), 0)
    per_worker["driver"] = counts.get("driver", 0)
    return per_worker


def test_a_batchs_tasks_run_in_executors_of_both_workers_and_none_on_the_driver(spark, kafka, topic, lake, checkpoints):
    assert lake.root.startswith("s3://"), "the cluster tier's lakes are on the S3 endpoint"
    produce_activities(kafka, topic, 600)
    before = tasks_per_worker()
    plan = plan_next_batch(STREAM, topic, checkpoints.latest_plan(STREAM), kafka.watermarks(topic), 10_000)
    assert checkpoints.record_plan(plan)
    result = ingest_batch(spark, lake, checkpoints, kafka.bootstrap_servers, plan)

    assert result.rows_appended == 600 and lake.read(ENGAGEMENT_ACTIVITY.name).num_rows == 600
    ran = tasks_per_worker() - before
    assert ran["driver"] == 0
    assert ran[WORKERS[0]] > 0 and ran[WORKERS[1]] > 0, ran


def executor_view(driver_file: str):
    """A Spark task's view of its process: its folders, the names of its environment, and whether it sees a file
    the driver side wrote in its temporary folder."""

    def view(batches):
        import tempfile

        for batch in batches:
            yield pa.RecordBatch.from_pydict(
                {
                    "cwd": [os.getcwd()] * batch.num_rows,
                    "tmp": [tempfile.gettempdir()] * batch.num_rows,
                    "env": [sorted(os.environ)] * batch.num_rows,
                    "sees_driver_file": [os.path.exists(driver_file)] * batch.num_rows,
                    "tz": [os.environ.get("TZ")] * batch.num_rows,
                }
            )

    return view


def test_an_executor_shares_neither_the_drivers_environment_nor_its_folders(spark, monkeypatch, tmp_path):
    monkeypatch.setenv("EP_LAKE_ROOT", "s3://only-the-driver-knows")  # the driver side has it; executors must not
    driver_file = tmp_path / "written-by-the-driver"
    driver_file.write_text("a path a task must never be handed")
    assert driver_file.is_relative_to("/tmp"), (
        "the suite's temporary folders are under /tmp, which workers do not share"
    )
    schema = "cwd string, tmp string, env array<string>, sees_driver_file boolean, tz string"
    rows = spark.range(8, numPartitions=8).mapInArrow(executor_view(str(driver_file)), schema).collect()

    for row in rows:
        leaked = [name for name in row.env if name.startswith(DRIVER_ONLY)]
        assert not leaked, f"the executor in {row.cwd} sees {leaked}"
        assert not row.sees_driver_file, f"the executor in {row.cwd} sees the driver's /tmp"
        assert row.tz == "UTC", "a row plugin's datetime without a zone must read the same on every node"
        worker = Path(row.cwd).relative_to(STATE).parts[0]
        assert worker in WORKERS and Path(row.cwd).is_relative_to(STATE / worker / "work"), row.cwd
        assert Path(row.tmp).is_relative_to(STATE / worker), row.tmp
    assert {Path(row.cwd).relative_to(STATE).parts[0] for row in rows} == set(WORKERS)


def test_a_backfill_of_an_export_on_the_drivers_disk_fails_saying_so_and_commits_nothing(
    spark, lake, checkpoints, tmp_path
):
    """An export the executors cannot see (the driver's /tmp) is refused with the reason and the path, not an
    executor's stack trace; the tenant's table gets no commit and the plan stays unfinished for a re-run."""
    from engagement_platform.profiles.backfill.apply import backfill_tenant
    from engagement_platform.profiles.tables import raw_table_name
    from engagement_platform.spark.local_input import LocalInputError
    from engagement_platform_tests.support.snapshots import UNTIL, snap, write_jsonl

    export = tmp_path / "export"
    export.mkdir()
    write_jsonl(export / "part-0.jsonl", [snap("1", 4, {"email": "a@x.io"})])

    with pytest.raises(
        LocalInputError, match=f"{re.escape(str(export))}.* is on the driver's disk and the Spark executors"
    ):
        backfill_tenant(spark, lake, checkpoints, "acme", export, UNTIL)
    assert lake.table(raw_table_name("acme")).version() == 0, "the tenant's table was created, nothing committed"
