"""The daily metrics sensor without servers: it compares the notification table's version with the metrics'
checkpoint (their txn), both kept between ticks until a table moves, so an idle tick loads neither table."""

from __future__ import annotations

import pyarrow as pa
from dagster import DagsterInstance, RunRequest, SkipReason, build_sensor_context
from deltalake import CommitProperties, Transaction, write_deltalake

from engagement_platform.engagement.metrics.apply import APP_ID, DAILY_METRICS
from engagement_platform.engagement.metrics.assets import engagement_daily_metrics_sensor
from engagement_platform.engagement.tables import ENGAGEMENT_NOTIFICATIONS
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.resources import LakeResource


def commit(lake: DeltaLake, name: str, txn: int | None = None) -> None:
    properties = CommitProperties(app_transactions=[Transaction(APP_ID, txn)]) if txn is not None else None
    write_deltalake(lake.uri(name), pa.table({"x": [1]}), mode="append", commit_properties=properties)


def test_a_refresh_is_requested_when_notifications_pass_the_checkpoint_and_idle_ticks_load_nothing(
    tmp_path, monkeypatch
):
    lake = DeltaLake(str(tmp_path / "lake"))
    resources = {"lake": LakeResource(root=lake.root)}
    loads = []
    table = DeltaLake.table
    monkeypatch.setattr(DeltaLake, "table", lambda self, *a, **k: loads.append(a) or table(self, *a, **k))

    def tick():
        with build_sensor_context(instance=instance, resources=resources) as ctx:
            return engagement_daily_metrics_sensor(ctx)

    with DagsterInstance.ephemeral() as instance:
        assert tick().skip_message == "no notifications yet"
        commit(lake, ENGAGEMENT_NOTIFICATIONS.name)
        commit(lake, ENGAGEMENT_NOTIFICATIONS.name)  # version 1
        commit(lake, DAILY_METRICS.name, txn=1)  # the metrics have read up to notifications version 1
        assert isinstance(tick(), SkipReason)
        loaded = len(loads)
        assert isinstance(tick(), SkipReason) and len(loads) == loaded, "nothing moved: no table loaded"

        commit(lake, ENGAGEMENT_NOTIFICATIONS.name)  # version 2
        request = tick()
        assert isinstance(request, RunRequest) and request.run_key.endswith("notifications@2")
        commit(lake, DAILY_METRICS.name, txn=2)  # the refresh read it
        assert isinstance(tick(), SkipReason)
