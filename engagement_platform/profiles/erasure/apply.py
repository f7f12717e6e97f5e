"""Profile erasure stream: one planned slice of `profile.erasure` -> each requested identity out of every
profile table, and on the suppression list so that it never comes back.

Requests (JSON, one per Kafka message on EP_PROFILE_ERASURE_TOPIC, default `profile.erasure`):

    {"request_id": "pe1", "tenant": "acme", "subject_id": "u-000123", "request_time": "2026-02-01T00:00:00Z"}

Which ids go with the subject: its whole merged identity (identity.py has the rule).

Lifecycle (streams/batch.py; txn app id `profile.erasure`, version = batch id, stream `profile_erasure`):

compute  The ingest framework validates the slice (pipeline.yaml); repeated request ids (in the batch, or
         already in profile_erasure_audit) are flagged on the driver. The as-of time and the versions of
         the tenants' raw tables and of staging are pinned in the first commit's metadata (a re-run finds
         the same identities).
commit   holding every involved tenant's lock (profiles/locks.py, fenced by all of them):
         quarantine_profile_erasure (malformed or repeated requests, minus those naming an erased id),
         profile_erased_subjects (every erased id's keyed hash: from this commit on the dumper and backfill
         drop their changes), profile_raw/<tenant> per tenant and profile_cdc_staging (file rewrites
         without the identity's rows: lake/row_erasure.py, no id in the log), quarantine_profile_cdc
         (delete by key of the records naming an erased id), profile_segments and profile_segment_changes
         (file rewrites without the identity), profile_suppressed_records,
         profile_erasure_audit (per request: the subject's hash, ids erased, rows removed per table).
         Then a checkpoint of each table it changed, so the upkeep's log cleanup can drop older entries.

Staging rewrites: the processor reads staging by snapshot difference, so the rewritten files' other rows
look new to it and are read once more as stale changes (dropped by the CDC sequence rule).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from engagement_platform.ingest.erasure import pipeline_erasure_steps, pipelines_naming_people
from engagement_platform.ingest.errors import ERRORS
from engagement_platform.ingest.pipeline import QuarantineContext, quarantine_rows
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import BatchTxn, DeltaLake, text_column
from engagement_platform.lake.file_writes import filesystem
from engagement_platform.lake.row_erasure import (
    checkpoint_tables,
    commit_bytes,
    delete_quarantined,
    erase_rows,
    live_files,
    purge_quarantine,
    quarantined_keys_naming,
)
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.lake.suppression_tables import (
    drop_suppressed_quarantine,
    hits_table,
    load_suppressed,
    suppressed_rows,
    suppressed_step,
)
from engagement_platform.profiles.erasure.audit import ProfileErasureResult, Tally, audit_rows, erased_subject_rows
from engagement_platform.profiles.erasure.identity import identity_ids
from engagement_platform.profiles.erasure.validate import ErasureRequest, validate_requests
from engagement_platform.profiles.locks import tenant_locks
from engagement_platform.profiles.processor.progress import processed_version
from engagement_platform.profiles.segments.tables import PROFILE_SEGMENT_CHANGES, PROFILE_SEGMENTS
from engagement_platform.profiles.snapshots import SnapshotListings
from engagement_platform.profiles.tables import (
    PROFILE_CDC_STAGING,
    PROFILE_ERASED_SUBJECTS,
    PROFILE_ERASURE_AUDIT,
    PROFILE_SUPPRESSED_RECORDS,
    QUARANTINE_PROFILE_CDC,
    QUARANTINE_PROFILE_ERASURE,
    raw_table_name,
    raw_table_spec,
)
from engagement_platform.settings import load_settings
from engagement_platform.streams.batch import CommitStep, Outcomes, commit_batch
from engagement_platform.streams.pin import Pin, pin_batch
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec

STREAM = "profile_erasure"
APP_ID = "profile.erasure"
LOCK = "profile_erasure"  # one erasure batch at a time; each also takes its tenants' locks
PURGE_APP_ID = "profile.erasure.purge"  # the quarantine purge after the batch (its own commits)


def _rows_at(lake: DeltaLake, name: str, version: int, expr: ds.Expression | None, columns: list[str]) -> list[dict]:
    if version < 0 or not lake.exists(name):
        return []
    return (
        lake.table(name, version).to_pyarrow_dataset().to_table(columns=columns, filter=expr).to_pylist()
    )  # views read as str


def erased_identities(lake: DeltaLake, requests: list[ErasureRequest], pin: Pin) -> dict[str, set[str]]:
    """request id -> the ids its erasure removes (identity.identity_ids over every link of the tenant's raw
    table and staged changes), read at the pinned versions (inside the tenants' locks)."""
    links: dict[str, tuple[list[dict], list[dict]]] = {}
    listings = SnapshotListings(lake, PROFILE_CDC_STAGING.name)
    for tenant in sorted({r.tenant for r in requests}):
        raw = _rows_at(
            lake, raw_table_name(tenant), pin.versions[raw_table_name(tenant)], None, ["primary_id", "related_ids"]
        )
        # only changes not merged yet: merged ones are in the raw table's links (and may carry links split since)
        unmerged = listings.added(tenant, processed_version(lake, tenant), pin.versions[PROFILE_CDC_STAGING.name])
        links[tenant] = (raw, _staged_links(lake, unmerged))
    return {r.request_id: identity_ids(r.subject_id, *links[r.tenant]) for r in requests}


def _staged_links(lake: DeltaLake, uris: list[str]) -> list[dict]:
    rows = []
    for uri in uris:
        fs, path = filesystem(uri, lake.storage_options)
        rows += pq.read_table(path, columns=["primary_id", "related_ids"], filesystem=fs).to_pylist()
    return rows


def _raw_files(lake: DeltaLake, tenant: str, ids: set[str]):
    """The tenant raw table's files whose primary_id range can hold one of `ids` (a row naming an id in its
    related ids is linked to it, so identity_ids put its primary id among them too)."""
    spec = raw_table_spec(tenant)
    if not lake.exists(spec.name):
        return []
    stats = lake.file_stats(spec.name)
    low = stats["min.primary_id"].to_pylist() if "min.primary_id" in stats.column_names else [None] * stats.num_rows
    high = stats["max.primary_id"].to_pylist() if "max.primary_id" in stats.column_names else [None] * stats.num_rows
    keep = {
        p
        for p, lo, hi in zip(stats["path"].to_pylist(), low, high)
        if lo is None or hi is None or any(lo <= i <= hi for i in ids)
    }
    return [f for f in live_files(lake, spec) if f.path in keep]


def erase_profiles_batch(
    spark: SparkSession,
    lake: DeltaLake,
    checkpoints: CheckpointStore,
    bootstrap_servers: str,
    plan: BatchPlan,
    coordinator=None,
    kafka_config: dict | None = None,
) -> ProfileErasureResult:
    seconds: dict[str, float] = {}
    batch, secret = plan.batch_id, load_settings().erasure.secret
    t0 = time.perf_counter()
    validated, requests = validate_requests(spark, lake, bootstrap_servers, plan, kafka_config)
    seconds["read_validate"] = time.perf_counter() - t0
    tenants = sorted({r.tenant for r in requests})
    bad = validated.filter(pc.greater(pc.list_value_length(validated[ERRORS]), 0))

    with tenant_locks(coordinator, tenants, f"{STREAM}/{batch}"):
        # pinned inside the locks: no processor or backfill merge can land between the pin and the rewrites
        pin = pin_batch(
            lake,
            QUARANTINE_PROFILE_ERASURE.name,
            APP_ID,
            batch,
            [*(raw_table_name(t) for t in tenants), PROFILE_CDC_STAGING.name],
        )
        quarantine = quarantine_rows(
            bad, QuarantineContext(STREAM, batch, plan.topic, pin.as_of, kafka=True), org_column="tenant"
        )
        t1 = time.perf_counter()
        ids = erased_identities(lake, requests, pin)
        by_tenant: dict[str, set[str]] = {}
        for r in requests:
            by_tenant.setdefault(r.tenant, set()).update(ids[r.request_id])
        erased = Suppressed.of_subjects(secret, ((t, i) for t, tids in by_tenant.items() for i in tids))
        known = load_suppressed(lake, PROFILE_ERASED_SUBJECTS, secret)
        quarantine, hits = drop_suppressed_quarantine(quarantine, Suppressed.of(secret, known.pairs() | erased.pairs()))
        tally = Tally(requests, ids)
        seconds["identities"] = time.perf_counter() - t1

        def raw_step(tenant: str) -> CommitStep:
            spec = raw_table_spec(tenant)

            def commit(txn: BatchTxn, _: Outcomes) -> int | None:
                if lake.exists(spec.name) and lake.already_committed(spec.name, txn):
                    tally.read_back(lake, spec.name, txn)
                    return None
                version, _ = erase_rows(
                    lake,
                    spec,
                    _raw_files(lake, tenant, by_tenant[tenant]),
                    tally.remover(spec.name, {tenant}),
                    txn,
                    lambda: tally.of_table(spec.name),
                )
                return version

            return CommitStep(spec.name, commit)

        def staging_step(txn: BatchTxn, _: Outcomes) -> int | None:
            if lake.exists(PROFILE_CDC_STAGING.name) and lake.already_committed(PROFILE_CDC_STAGING.name, txn):
                tally.read_back(lake, PROFILE_CDC_STAGING.name, txn)
                return None
            files = [f for t in tenants for f in live_files(lake, PROFILE_CDC_STAGING, {"tenant": t})]
            version, _ = erase_rows(
                lake,
                PROFILE_CDC_STAGING,
                files,
                tally.remover(PROFILE_CDC_STAGING.name, set(tenants)),
                txn,
                lambda: tally.of_table(PROFILE_CDC_STAGING.name),
            )
            return version

        def membership_step(spec):
            def commit(txn: BatchTxn, _: Outcomes) -> int | None:
                """Segment membership and its entries / exits: an identity is keyed by its component id, one of its ids."""

                def remove(rows: pa.Table) -> pa.Array:
                    mask = pa.array([False] * rows.num_rows, pa.bool_())
                    for tenant, tids in by_tenant.items():
                        hit = pc.and_(
                            pc.equal(rows["tenant"], tenant),
                            pc.is_in(rows["identity"], value_set=pa.array(sorted(tids), pa.string())),
                        )
                        mask = pc.or_(mask, hit)
                    return mask

                files = [f for t in tenants for f in live_files(lake, spec, {"tenant": t})]
                return erase_rows(lake, spec, files, remove, txn)[0]

            return CommitStep(spec.name, commit)

        def quarantine_step(txn: BatchTxn, _: Outcomes) -> int | None:
            if lake.exists(QUARANTINE_PROFILE_CDC.name) and lake.already_committed(QUARANTINE_PROFILE_CDC.name, txn):
                return None
            keys = quarantined_keys_naming(
                lake, QUARANTINE_PROFILE_CDC, erased, text_column("org_id").isin(tenants) | ds.field("org_id").is_null()
            )
            return delete_quarantined(lake, QUARANTINE_PROFILE_CDC, keys, txn)[0]

        landing_removed: dict[str, int] = {}
        t2 = time.perf_counter()
        versions = commit_batch(
            plan,
            APP_ID,
            [
                CommitStep(
                    QUARANTINE_PROFILE_ERASURE.name,
                    lambda txn, _: lake.append(QUARANTINE_PROFILE_ERASURE, quarantine, txn),
                ),
                suppressed_step(
                    lake, PROFILE_ERASED_SUBJECTS, erased_subject_rows(requests, ids, secret, plan, pin.as_of)
                ),
                *(raw_step(t) for t in tenants),
                CommitStep(PROFILE_CDC_STAGING.name, staging_step),
                CommitStep(QUARANTINE_PROFILE_CDC.name, quarantine_step),
                membership_step(PROFILE_SEGMENTS),
                membership_step(PROFILE_SEGMENT_CHANGES),
                *pipeline_erasure_steps(
                    lake,
                    pipelines_naming_people(load_settings().pipelines_dir, PROFILE_ERASED_SUBJECTS.name),
                    erased,
                    landing_removed,
                ),
                suppressed_step(
                    lake,
                    PROFILE_SUPPRESSED_RECORDS,
                    suppressed_rows(PROFILE_SUPPRESSED_RECORDS, hits_table(hits), STREAM, batch, pin.as_of),
                ),
                CommitStep(
                    PROFILE_ERASURE_AUDIT.name,
                    lambda txn, _: lake.append(
                        PROFILE_ERASURE_AUDIT, audit_rows(requests, ids, tally, secret, plan), txn
                    ),
                ),
            ],
            checkpoints,
            ranges=plan.ranges_json(),
            **pin.metadata(),
        )
        # refused requests of earlier batches naming an id erased now (own txn; idempotent on a re-run)
        purged = purge_quarantine(
            lake, QUARANTINE_PROFILE_ERASURE, load_suppressed(lake, PROFILE_ERASED_SUBJECTS, secret), PURGE_APP_ID
        )
        checkpoint_tables(
            lake,
            [t for t, v in versions.items() if v is not None and t != PROFILE_ERASURE_AUDIT.name]
            + ([QUARANTINE_PROFILE_ERASURE.name] if purged else []),
        )
        seconds["commit"] = time.perf_counter() - t2
    totals: dict[str, int] = dict(landing_removed)
    for counts in tally.removed.values():
        for t, n in counts.items():
            totals[t] = totals.get(t, 0) + n
    rewritten = [commit_bytes(lake, t, v) for t, v in versions.items() if v is not None]
    return ProfileErasureResult(
        plan,
        validated.num_rows,
        len(requests),
        validated.num_rows - len(requests) - len(hits),
        len(hits),
        sum(len(v) for v in by_tenant.values()),
        totals,
        versions,
        tenants,
        seconds,
        bytes_written=sum(a for a, _ in rewritten),
        bytes_removed=sum(r for _, r in rewritten),
    )


def run_batch(ctx: BatchContext, plan: BatchPlan) -> ProfileErasureResult:
    return erase_profiles_batch(ctx.spark, ctx.lake, ctx.checkpoints, ctx.kafka_servers, plan, ctx.coordinator)


SPEC = StreamSpec(name=STREAM, app_id=APP_ID, run_batch=run_batch, lock_name=LOCK)
