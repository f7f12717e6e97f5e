"""Every stream of the platform, one line each: the list definitions.py assembles the Definitions from and
the `run-batch` command resolves a stream's name in. Each entry is a stream package's `DEFINITION`
(streams/definition.py: its Dagster parts, settings section, tables and run-batch adapter); the landing
pipelines are one entry, a family with a stream per YAML file. Like definitions.py, this module may import
every domain; no domain imports it. It imports no Dagster: run-batch, a process per batch, never loads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from engagement_platform.engagement.ingestion.stream import DEFINITION as INGESTION
from engagement_platform.engagement.mutation.stream import DEFINITION as MUTATION
from engagement_platform.engagement.retention.stream import DEFINITION as RETENTION
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.landing.stream import DEFINITION as LANDING
from engagement_platform.profiles.backfill.stream import DEFINITION as PROFILE_BACKFILL
from engagement_platform.profiles.erasure.stream import DEFINITION as PROFILE_ERASURE
from engagement_platform.profiles.processor.stream import DEFINITION as PROFILE_PROCESSOR
from engagement_platform.profiles.segments.stream import DEFINITION as PROFILE_SEGMENTS
from engagement_platform.profiles.staging.stream import DEFINITION as PROFILE_CDC
from engagement_platform.streams.by_hand import BatchRequest, BatchRequestError, BatchRun
from engagement_platform.streams.definition import RegistryEntry, StreamDefinition, StreamFamily

STREAMS: tuple[RegistryEntry, ...] = (
    INGESTION,
    MUTATION,
    RETENTION,  # the engagement activity lake
    PROFILE_CDC,
    PROFILE_ERASURE,
    PROFILE_PROCESSOR,
    PROFILE_BACKFILL,
    PROFILE_SEGMENTS,  # the unified-profile CDC lake
    LANDING,  # landing-file pipelines
)


def stream_names(entries: Sequence[RegistryEntry] = STREAMS) -> list[str]:
    """run-batch's names, a family's as its pattern ("profile_processor/<tenant>")."""
    return [entry.name for entry in entries]


def find_stream(stream: str, entries: Sequence[RegistryEntry] = STREAMS) -> tuple[StreamDefinition, str] | None:
    """(the definition `stream` names, the member it names: "" for a stream of its own), or None. Families
    read from configuration are expanded only when no other entry matches."""
    for entry in entries:
        if isinstance(entry, StreamDefinition) and (member := entry.member(stream)) is not None:
            return entry, member
    for entry in entries:
        if isinstance(entry, StreamFamily):
            for definition in entry.members():
                if (member := definition.member(stream)) is not None:
                    return definition, member
    return None


def batch_run(
    stream: str,
    checkpoints: CheckpointStore,
    batch_id: int | None = None,
    path: str | None = None,
    until: str | None = None,
    entries: Sequence[RegistryEntry] = STREAMS,
) -> BatchRun:
    """How to run one batch of `stream` by hand, resolved and checked before anything runs."""
    found = find_stream(stream, entries)
    if found is None:
        raise BatchRequestError(f"unknown stream {stream!r}: one of {', '.join(stream_names(entries))}")
    definition, member = found
    if definition.run_batch is None:
        raise BatchRequestError(f"{stream} has no batch to run by hand")
    return definition.run_batch(BatchRequest(stream, member, checkpoints, batch_id, path, until))
