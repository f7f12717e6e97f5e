"""A pipeline's Dagster surface end to end: landing sensor -> partitioned run -> tables + checks."""

import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context, materialize

from engagement_platform.ingest.config import load_pipeline
from engagement_platform.landing.apply import planned_files, stream_name
from engagement_platform.landing.assets import pipeline_assets
from engagement_platform.landing.jobs import pipeline_job
from engagement_platform.landing.partitions import pipeline_batches
from engagement_platform.landing.sensors import landing_sensor
from engagement_platform.orchestration.runs import STREAM_TAG
from engagement_platform.resources import CoordinatorResource, LakeResource, SparkResource
from engagement_platform.settings import REPO_ROOT, load_settings
from engagement_platform.streams.coordinator import Coordinator

MEMBERS = """id,name,bday,level,email,points
1,Ann Lee,01/02/1990,G,ann@example.com,10
2,Bob Stone,1990-13-45,S,bob@example.com,5
3,"unterminated
4,Cy Young,1985-05-05,gold,cy@example.com,7
5,Dee Park,1970-01-01,bronze,,-3
"""


@pytest.fixture
def config():
    return load_pipeline(REPO_ROOT / "pipelines" / "rewards_members.yaml")


def test_a_landed_file_is_planned_once_run_and_checked(config, landing, lake_root, checkpoints, spark, stack):
    sensor = landing_sensor(config, pipeline_job(config))
    resources = {
        "lake": LakeResource(root=lake_root),
        "coordinator": CoordinatorResource(lake=LakeResource(root=lake_root)),
    }
    with DagsterInstance.ephemeral() as instance:

        def tick():
            with build_sensor_context(instance=instance, resources=resources) as ctx:
                return sensor(ctx)

        assert "no new files" in tick().skip_reason.skip_message
        (landing / "stores-2026-11-01.csv").write_text(MEMBERS)
        # While another writer holds the target table's lock, no run is launched (it would only wait).
        other = Coordinator(stack["ZOOKEEPER_HOSTS"], load_settings().zookeeper_root)
        other.start()
        held = other.lock(config.target.table, "someone/else", 10.0)
        try:
            waiting = tick()
            assert not waiting.run_requests and "waits for its turn: lock" in waiting.skip_reason.skip_message, (
                waiting.skip_reason
            )
        finally:
            other.unlock(held)
            other.close()
        first = tick()
        assert isinstance(first, SensorResult)
        (request,) = first.run_requests
        assert request.partition_key == "00000001" and request.tags[STREAM_TAG] == stream_name(config)
        assert request.tags["ingest/file"].endswith("stores-2026-11-01.csv")
        assert first.asset_events[0].metadata["files_waiting"].value == 1

        instance.add_dynamic_partitions(pipeline_batches(config).name, ["00000001"])
        out = materialize(
            pipeline_assets(config),
            partition_key="00000001",
            instance=instance,
            selection=["ingest_rewards_members"],
            resources={**resources, "spark": SparkResource(spark_config={"spark.remote": stack["SPARK_REMOTE"]})},
        )
        assert out.success
        checks = {e.check_name: e for e in out.get_asset_check_evaluations()}
        assert checks["records_conserved"].passed
        assert checks["records_conserved"].metadata["records_read"].value == 5
        assert checks["records_conserved"].metadata["rows_in_table"].value == 2
        assert checks["records_conserved"].metadata["records_quarantined"].value == 3
        rate = checks["error_rate_under_threshold"]
        assert not rate.passed and rate.severity.value == "WARN" and rate.metadata["error_rate"].value == 0.6

        assert "no new files" in tick().skip_reason.skip_message, "an ingested file is never planned again"
        # A backlog (files that landed while batch 1 ran, or while the daemon was down) is one batch, not one run per file.
        for day in ("02", "03", "04"):
            (landing / f"stores-2026-11-{day}.csv").write_text(MEMBERS.replace("Ann", f"Ann{day}"))
        backlog = tick()
        (request,) = backlog.run_requests
        assert request.partition_key == "00000002" and request.tags["ingest/files"] == "3", request.tags
        plan = checkpoints.plan(stream_name(config), 2)
        assert [f.path.rsplit("/", 1)[-1] for f in planned_files(plan)] == [
            f"stores-2026-11-{d}.csv" for d in ("02", "03", "04")
        ]
