"""`engagement-platform status`, assembled: which streams (streams.py), then per stream its latest batch
(lake.py), attempts and pause (runs.py), lock (locks.py) and lag (kafka_lag.py, or the processor's view of a
tenant). Each service is asked at most once per command and guarded on its own: one that does not answer
makes its columns UNAVAILABLE while the others still report.

Lag in seconds: now minus the time of the oldest record not committed; when that is not known, now minus
when the unfinished batch was planned. For a processor tenant, its replication lag (CDC times,
profiles/lag.py) and its staged records not merged yet. Read-only: nothing is written to ZooKeeper, Kafka
or the lake.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from engagement_platform.lake.checkpoints import CHECKPOINTS, CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.settings import Settings, load_settings
from engagement_platform.status.kafka_lag import KafkaProbe, kafka_lag
from engagement_platform.status.lake import LakeReads, latest_batch, processor_facts, tenant_lag
from engagement_platform.status.locks import ZooKeeperProbe
from engagement_platform.status.report import Report, StreamStatus
from engagement_platform.status.streams import platform_streams, selected

if TYPE_CHECKING:
    from dagster import DagsterInstance


def collect(
    settings: Settings | None = None,
    wanted: str | None = None,
    instance: DagsterInstance | None = None,
    now: datetime | None = None,
) -> Report:
    """The status of every stream (those `wanted` names: see streams.selected). `instance`: a DagsterInstance to
    read runs from instead of the deployment's (tests)."""
    from engagement_platform.status.runs import run_storage

    settings = settings or load_settings()
    now = now or datetime.now(UTC)
    reads = LakeReads(DeltaLake(settings.lake_root, settings.storage_options or None))
    nothing: set[str] = set()
    planned = reads.guarded(reads.stream_names, nothing)
    facts = reads.guarded(lambda: processor_facts(reads.lake), None)
    refs = selected(platform_streams(settings, planned, facts.lags if facts else ()), wanted)
    names = [r.name for r in refs if r.name in planned]
    store = CheckpointStore(reads.lake)
    rows = reads.guarded(lambda: store.rows_of(names) if names else CHECKPOINTS.schema.empty_table(), None)
    kafka = KafkaProbe(settings.kafka_bootstrap_servers, settings.kafka_config)
    zookeeper = ZooKeeperProbe(settings)
    statuses = []
    with zookeeper.session(), run_storage(settings, instance) as runs:
        for ref in refs:
            latest = latest_batch(reads, ref, rows)
            span = facts.spans.get(ref.tenant) if facts is not None and ref.tenant else None
            statuses.append(
                StreamStatus(
                    stream=ref.name,
                    family=ref.family,
                    tenant=ref.tenant,
                    source=ref.source,
                    batch=latest.batch,
                    attempts=runs.attempts(ref, latest.batch, span),
                    lock=zookeeper.lock(ref.lock) if ref.lock else None,
                    lag=kafka_lag(kafka, ref.topic, latest, now)
                    if ref.topic
                    else tenant_lag(facts, ref, latest.batch, now),
                )
            )
        services = (reads.service, kafka.service, zookeeper.service, runs.service)
    return Report(now, services, tuple(statuses))
