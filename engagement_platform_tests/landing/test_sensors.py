"""The landing sensor without servers (coordinator off): an idle tick reports the landing folder's counts only when
they changed, and reads no table when nothing moved; a landed file is still planned at once."""

from __future__ import annotations

import json

from dagster import DagsterInstance, build_sensor_context

from engagement_platform.ingest.config import load_pipeline
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.landing.jobs import pipeline_job
from engagement_platform.landing.sensors import landing_sensor
from engagement_platform.orchestration.reported import REPORTED
from engagement_platform.resources import CoordinatorResource, LakeResource
from engagement_platform.settings import REPO_ROOT


def test_idle_ticks_report_the_folder_once_and_a_landed_file_is_planned(landing, tmp_path, monkeypatch):
    config = load_pipeline(REPO_ROOT / "pipelines" / "rewards_members.yaml")
    sensor = landing_sensor(config, pipeline_job(config))
    lake = LakeResource(root=str(tmp_path / "lake"))
    resources = {"lake": lake, "coordinator": CoordinatorResource(lake=lake, enabled=False)}
    reads = []
    read = DeltaLake.read
    monkeypatch.setattr(DeltaLake, "read", lambda self, *a, **k: reads.append(a) or read(self, *a, **k))

    with DagsterInstance.ephemeral() as instance:

        def tick(cursor):
            with build_sensor_context(instance=instance, resources=resources, cursor=cursor) as ctx:
                return sensor(ctx)

        first = tick(None)
        assert "no new files" in first.skip_reason.skip_message and len(first.asset_events) == 1
        second = tick(first.cursor)
        assert "no new files" in second.skip_reason.skip_message
        assert second.asset_events == [] and second.cursor is None

        (landing / "members-1.csv").write_text("id,name\n1,Ann\n")
        planned = tick(first.cursor)
        (request,) = planned.run_requests
        assert request.partition_key == "00000001"
        assert [e.metadata["files_waiting"].value for e in planned.asset_events] == [1]
        assert json.loads(planned.cursor)["batch_id"] == 1 and REPORTED not in json.loads(planned.cursor)

        lake.checkpoints.mark_done(lake.checkpoints.latest_plan(request.tags["engagement/stream"]))
        done = tick(planned.cursor)
        assert [e.metadata["files_waiting"].value for e in done.asset_events] == [0]
        before = len(reads)
        assert tick(done.cursor).asset_events == [] and len(reads) == before, "nothing moved: no table read"
