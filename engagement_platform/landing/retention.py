"""Landing retention: the landing folder is a mailbox, not an archive of personal data. A landed file
whose batch is done leaves once older than half the erasure window (EP_ERASURE_WINDOW): what it held is in
the pipeline's tables, where erasure reaches it (ingest/erasure.py). Files not planned yet, or whose batch is
unfinished, stay. The sensor plans files by path and size from the checkpoint store, so a removed file is
never planned again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.landing.apply import landing_files, planned_files, stream_name
from engagement_platform.landing.files import LandedFile, delete_landed
from engagement_platform.settings import load_settings


def expired_landed_files(
    landing_root: str,
    config: PipelineConfig,
    checkpoints: CheckpointStore,
    older_than: timedelta,
    now: datetime | None = None,
) -> list[LandedFile]:
    """The pipeline's landed files that a done batch ingested and that were last written before now - `older_than`."""
    stream = stream_name(config)
    done = {
        (f.path, f.size)
        for p in checkpoints.plans(stream)
        if checkpoints.is_done(stream, p.batch_id)
        for f in planned_files(p)
    }
    cutoff = ((now or datetime.now(UTC)) - older_than).timestamp()
    return [f for f in landing_files(landing_root, config) if (f.path, f.size) in done and f.modified < cutoff]


def expire_landed_files(
    landing_root: str, configs: list[PipelineConfig], checkpoints: CheckpointStore, older_than: timedelta
) -> list[str]:
    """Delete every pipeline's expired landed files; the paths deleted."""
    deleted = []
    for config in configs:
        for landed in expired_landed_files(landing_root, config, checkpoints, older_than):
            delete_landed(landed.path, load_settings().storage_options)
            deleted.append(landed.path)
    return deleted
