"""Which streams exist, and what status needs to know of each: its txn app id (which tables already hold a
batch), the tables it commits, its lock, its Kafka topic, and how Dagster partitions its runs.

The list comes from the registry (registry.py): every stream of its own, every landing pipeline, and for a
per-tenant family every tenant the lake knows (checkpoint stream names, staged tenants). `stream_ref` is the
one place that maps a registry entry to the facts its definition does not carry (app id, lock, topic).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engagement_platform.settings import Settings

BY_BATCH, BY_TENANT = "batch", "tenant"  # what a stream's Dagster partition is


@dataclass(frozen=True)
class StreamRef:
    name: str  # checkpoint stream name
    family: str  # the registry's name, or its family ("profile_processor", "ingest") for a member
    tenant: str | None
    app_id: str | None  # None: unknown (a checkpoint stream no definition claims)
    tables: tuple[str, ...]  # the tables its batches commit, as the registry lists them
    lock: str | None  # the coordinator lock its Dagster runs take; None: none
    topic: str | None  # the Kafka topic it reads; None: another source
    source: str
    partitioned_by: str | None  # BY_BATCH, BY_TENANT; None: its runs are not Dagster partitions
    job: str | None = None  # the Dagster job of a tenant-partitioned stream
    pauses: bool = False  # whether its sensor pauses it after MAX_ATTEMPTS failures


def kafka_topics(settings: Settings) -> dict[str, str]:
    """Kafka stream -> the topic its sensor reads (from the settings, as its stream definition binds it)."""
    return {
        "ingestion": settings.ingestion.topic,
        "mutation": settings.mutation.topic,
        "retention": settings.retention.topic,
        "profile_cdc": settings.profiles.cdc_topic,
        "profile_erasure": settings.profiles.erasure_topic,
    }


def platform_streams(settings: Settings, planned: Iterable[str], tenants: Iterable[str] = ()) -> list[StreamRef]:
    """Every stream, in the registry's order: each family's members are the tenants named in `planned`
    (checkpoint stream names), and for the processor also those in `tenants` (staged ones). Then any other
    stream name in `planned`."""
    from engagement_platform.registry import STREAMS
    from engagement_platform.streams.definition import expand

    planned = set(planned)
    refs = []
    for definition in expand(STREAMS):
        family = definition.family
        if family is None:
            ref = stream_ref(settings, definition.name, definition.aliases, definition.tables)
            refs += [ref] if ref is not None else []
            continue
        members = {n.partition("/")[2] for n in planned if n.partition("/")[0] == family}
        members |= set(tenants) if family == "profile_processor" else set()
        for member in sorted(m for m in members if valid_tenant(m)):
            ref = stream_ref(settings, f"{family}/{member}", (), definition.tables)
            refs += [ref] if ref is not None else []
    named = {r.name for r in refs}
    refs += [StreamRef(n, "", None, None, (), None, None, "", None) for n in sorted(planned - named)]
    return refs


def stream_ref(settings: Settings, name: str, aliases: tuple[str, ...], tables: tuple) -> StreamRef | None:
    """What status knows of the registry stream `name` (a family's member: "profile_processor/tenant01");
    None for a name it has no facts for."""
    from engagement_platform.engagement.ingestion.apply import SPEC as INGESTION
    from engagement_platform.engagement.mutation.apply import SPEC as MUTATION
    from engagement_platform.engagement.retention.apply import SPEC as RETENTION
    from engagement_platform.profiles.assets import PROCESSOR_JOB, SEGMENTS_JOB
    from engagement_platform.profiles.backfill.apply import backfill_app_id
    from engagement_platform.profiles.erasure.apply import SPEC as PROFILE_ERASURE
    from engagement_platform.profiles.locks import tenant_lock_name
    from engagement_platform.profiles.processor.planning import processor_app_id
    from engagement_platform.profiles.segments.apply import segments_app_id
    from engagement_platform.profiles.staging.apply import SPEC as PROFILE_CDC
    from engagement_platform.profiles.tables import raw_table_name

    table_names = tuple(t.name for t in tables)
    own = {s.name: s for s in (INGESTION, MUTATION, RETENTION, PROFILE_CDC, PROFILE_ERASURE)}
    if name in own:
        spec, topic = own[name], kafka_topics(settings)[name]
        return StreamRef(
            name, name, None, spec.app_id, table_names, spec.lock_name, topic, f"kafka {topic}", BY_BATCH, pauses=True
        )
    family, _, tenant = name.partition("/")
    if family == "ingest" and aliases:
        # A landing pipeline: its checkpoint stream is its alias; its runs lock its target, the first of its tables.
        stream = aliases[0]
        return StreamRef(
            stream, family, None, stream, table_names, table_names[0], None, "landing files", BY_BATCH, pauses=True
        )
    # The tenant's raw table is the member's own: the registry lists only the tables the family shares.
    raw = (raw_table_name(tenant), *table_names) if family in ("profile_processor", "profile_backfill") else ()
    if family == "profile_processor":
        app_id, lock, source, job = (
            processor_app_id(tenant),
            tenant_lock_name(tenant),
            "staging versions",
            PROCESSOR_JOB,
        )
    elif family == "profile_backfill":
        app_id, lock, source = backfill_app_id(tenant), tenant_lock_name(tenant), "snapshot export files"
        job = "profile_backfill_job"
    elif family == "profile_segments":
        app_id, lock, source, job = segments_app_id(tenant), None, "raw table versions", SEGMENTS_JOB
    else:
        return None
    pauses = family == "profile_processor"  # its sensor pauses a tenant; backfills run by hand, evaluations never pause
    return StreamRef(name, family, tenant, app_id, raw or table_names, lock, None, source, BY_TENANT, job, pauses)


def valid_tenant(tenant: str) -> bool:
    from engagement_platform.profiles.tables import validate_tenant

    try:
        validate_tenant(tenant)
    except ValueError:
        return False
    return True


def selected(refs: list[StreamRef], wanted: str | None) -> list[StreamRef]:
    """The streams `--stream` names: a stream, a family (every tenant's), or a pipeline as `ingest/<name>`."""
    if not wanted:
        return refs
    wanted = wanted.strip().rstrip("/")
    dotted = wanted.replace("/", ".", 1) if wanted.startswith("ingest/") else wanted
    return [r for r in refs if r.name in (wanted, dotted) or r.family == wanted]
