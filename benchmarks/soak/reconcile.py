"""The soak's verdict: the lake's tables (read with deltalake, no Spark) against the oracle, the stopped Dagster
instance's runs, sensor ticks (a stream still paused at the end fails the soak: its faults had cleared) and asset
checks, and the faults with their recovery times; printed, with a final PASS/FAIL line.

Per table: rows lost (expected, absent), duplicated (a key more than once), wrong (same key, a checked column
differs) and unexpected (present, not expected); quarantines per reason (records, i.e. distinct source positions,
per set of error codes; duplicate_in_batch / already_in_table / duplicate_request count as `duplicate`) and error
rows stored twice; the request log and gdpr_audit hold each valid request once, and a retention request's
audit row the rows_removed the oracle counts for it; profile_erasure_audit holds each valid profile erasure once with
the ids_erased the oracle counts for it, and profile_suppressed_records per stream the records the oracle expects
dropped for naming an erased profile id; the landing pipeline's table
(rewards_members, by member_id) and quarantine like the others, from the files the soak landed. Checks: per check
and partition (a partition is a batch), the latest evaluation must pass; a failed WARN-severity check is listed, not
counted (the soak's landing files keep within rewards_members' error-rate bound, so its check passes).
"""

from __future__ import annotations

import json
import os
import warnings
from collections import Counter, defaultdict

from deltalake import DeltaTable

from benchmarks.soak.faults import Fault, Sample, resumed_after, summary
from benchmarks.soak.oracle import CHECKED, DUPLICATE, EXPIRED, MEMBER_COLUMNS, expected
from benchmarks.soak.slots import max_concurrent_runs, run_spans, slot_usage
from benchmarks.soak.workload import ACTIVITIES, GDPR, LANDING, MUTATIONS, PROFILE_ERASURES, PROFILES, TENANTS

QUARANTINES = {
    ACTIVITIES: "quarantine_engagement_ingestion",
    MUTATIONS: "quarantine_engagement_mutations",
    GDPR: "quarantine_engagement_gdpr",
    PROFILES: "quarantine_profile_cdc",
    PROFILE_ERASURES: "quarantine_profile_erasure",
    LANDING: "quarantine_rewards_members",
}
DUPLICATE_CODES = {"duplicate_in_batch", "already_in_table", "duplicate_request"}
EXAMPLES = 5  # keys printed per kind of difference


def read(root: str, name: str, columns: list[str]) -> list[dict]:
    path = f"{root}/{name}"
    return DeltaTable(path).to_pyarrow_table(columns=columns).to_pylist() if DeltaTable.is_deltatable(path) else []


def as_delivered(messages, on_topic: Counter) -> tuple[list, list[str], list]:
    """The messages as the topics hold them: one the broker does not hold is left out, an extra copy it holds
    follows its original (the oracle counts it as a producer retry). Notes say where they differ from what was sent;
    the third item is the messages left out."""
    left, to_send, out, notes, lost = Counter(on_topic), Counter((m.topic, m.value) for m in messages), [], [], []
    for m in messages:
        key = (m.topic, m.value)
        to_send[key] -= 1
        if left[key] <= 0:
            notes.append(f"{m.topic} message {m.index} ({m.intent}) is not on the topic")
            lost.append(m)
            continue
        left[key] -= 1
        out.append(m)
        if to_send[key] == 0 and left[key] > 0:
            notes.append(f"{m.topic} message {m.index} ({m.intent}) is on the topic {left[key]} more time(s) than sent")
            out += [m] * left[key]
            left[key] = 0
    notes += [f"{n} message(s) on {topic} the soak did not send" for (topic, _), n in left.items() if n > 0]
    return out, notes, lost


def quarantined(root: str, name: str) -> tuple[Counter, int, list[dict]]:
    """(records per reason, error rows stored more than once, the rows)."""
    rows = read(root, name, ["row_id", "error_code", "column_name", "org_id", "input"])
    codes, copies = defaultdict(set), Counter((r["row_id"], r["error_code"], r["column_name"]) for r in rows)
    for r in rows:
        codes[r["row_id"]].add(DUPLICATE if r["error_code"] in DUPLICATE_CODES else r["error_code"])
    return Counter("+".join(sorted(c)) for c in codes.values()), sum(n - 1 for n in copies.values()), rows


def keyed_diff(name: str, expected_rows: dict, actual: list[tuple], equal) -> tuple[list[str], int]:
    """Lines and the number of differences between {key: row} and [(key, row)]."""
    count = Counter(k for k, _ in actual)
    lost, extra = sorted(expected_rows.keys() - count.keys()), sorted(count.keys() - expected_rows.keys())
    duplicated = sorted(k for k, n in count.items() if n > 1)
    wrong = sorted({k for k, row in actual if k in expected_rows and not equal(expected_rows[k], row)})
    lines = [
        f"{name}: expected {len(expected_rows)}, found {len(actual)}: lost {len(lost)}, duplicated {len(duplicated)}, "
        f"wrong {len(wrong)}, unexpected {len(extra)}"
    ]
    for label, keys in (("lost", lost), ("duplicated", duplicated), ("unexpected", extra)):
        lines += [f"    {label}: {k}" for k in keys[:EXAMPLES]]
    for k in wrong[:EXAMPLES]:
        lines.append(f"    wrong {k}: expected {expected_rows[k]}, found {[row for key, row in actual if key == k]}")
    return lines, len(lost) + len(extra) + len(duplicated) + len(wrong)


def lake_diff(messages, root: str, landed=(), lost=()) -> tuple[list[str], int, list[str], list[str]]:
    """(lines, differences, unaccounted, workload problems). `landed`: the landing files the soak landed; `lost`: the
    messages sent that the topics do not hold."""
    mutation_q = quarantined(root, QUARANTINES[MUTATIONS])
    expired = {
        (r["org_id"], json.loads(r["input"])["request_id"])
        for r in mutation_q[2]
        if r["error_code"] == EXPIRED and r["input"]
    }
    pending = {
        (r["org_id"], r["request_id"]) for r in read(root, "engagement_mutations_pending", ["org_id", "request_id"])
    }
    oracle = expected(messages, expired, pending, landed=landed, lost=lost)
    lines, differences = (
        [f"late-target requests: {len(oracle.late)}, of which expired: {len(expired)}, still pending: {len(pending)}"],
        0,
    )

    def add(diff: tuple[list[str], int]) -> None:
        nonlocal differences
        lines.extend(diff[0])
        differences += diff[1]

    rows = read(root, "engagement_activity", ["org_id", "engagement_id", *CHECKED])
    add(
        keyed_diff(
            "engagement_activity",
            oracle.activities,
            [((r["org_id"], r["engagement_id"]), r) for r in rows],
            lambda want, got: all(want[c] == got[c] for c in CHECKED),
        )
    )
    for topic, name in QUARANTINES.items():
        found, stored_twice, _ = mutation_q if topic == MUTATIONS else quarantined(root, name)
        want = oracle.quarantine[topic]
        off = {
            reason: (want[reason], found[reason])
            for reason in sorted(want.keys() | found.keys())
            if want[reason] != found[reason]
        }
        lines.append(
            f"{name}: expected {sum(want.values())} records, found {sum(found.values())}; error rows stored twice "
            f"{stored_twice}; by reason (expected, found) where they differ: {off or 'none'}"
        )
        differences += stored_twice + sum(abs(a - b) for a, b in off.values())
    members = read(root, "rewards_members", list(MEMBER_COLUMNS))  # the pipeline's target table
    add(
        keyed_diff(
            f"{LANDING} ({len(landed)} files landed)",
            oracle.members,
            [(r["member_id"], r) for r in members],
            lambda want, got: want == got,
        )
    )
    logged = [
        ((r["org_id"], r["request_id"]), r)
        for r in read(root, "engagement_mutation_requests", ["org_id", "request_id"])
    ]
    add(
        keyed_diff(
            "engagement_mutation_requests (one row per valid request)",
            {k: None for k in oracle.requests},
            logged,
            lambda want, got: True,
        )
    )
    audited = [
        ((r["org_id"], r["request_id"]), r) for r in read(root, "gdpr_audit", ["org_id", "request_id", "rows_removed"])
    ]
    add(
        keyed_diff(
            "gdpr_audit (one row per valid request; a retention request's rows_removed)",
            {k: oracle.removed.get(k) for k in oracle.gdpr_requests},
            audited,  # an erasure's (None) is not compared
            lambda want, got: want is None or got["rows_removed"] == want,
        )
    )
    erasures = [
        ((r["tenant"], r["request_id"]), r)
        for r in read(root, "profile_erasure_audit", ["tenant", "request_id", "ids_erased"])
    ]
    add(
        keyed_diff(
            "profile_erasure_audit (one row per valid request; its ids_erased)",
            oracle.profile_erasures,
            erasures,
            lambda want, got: got["ids_erased"] == want,
        )
    )
    suppressed = Counter()
    for r in read(root, "profile_suppressed_records", ["stream", "records"]):
        suppressed[r["stream"]] += r["records"]
    off = {
        s: (oracle.suppressed[s], suppressed[s])
        for s in sorted(oracle.suppressed.keys() | suppressed.keys())
        if oracle.suppressed[s] != suppressed[s]
    }
    lines.append(
        f"profile_suppressed_records: expected {sum(oracle.suppressed.values())} records, found {sum(suppressed.values())}; "
        f"by stream (expected, found) where they differ: {off or 'none'}"
    )
    differences += sum(abs(a - b) for a, b in off.values())
    for tenant in sorted(set(TENANTS) | set(oracle.profiles)):
        raw = read(root, f"profile_raw/{tenant}", ["primary_id", "deleted", "fields", "linked_ids", "cdc_seq"])
        actual = [
            (
                r["primary_id"],
                {
                    "deleted": bool(r["deleted"]),
                    "fields": json.loads(r["fields"]) if r["fields"] else None,
                    "linked_ids": list(r["linked_ids"] or []),
                    "cdc_seq": r["cdc_seq"],
                },
            )
            for r in raw
        ]
        add(keyed_diff(f"profile_raw/{tenant}", oracle.profiles.get(tenant, {}), actual, lambda want, got: want == got))
    return lines, differences, oracle.unaccounted, oracle.problems


def dagster_outcome(dagster_home: str) -> dict:
    """Runs by job and status, failed runs, batches retried, and each check's latest evaluation per partition."""
    os.environ["DAGSTER_HOME"] = dagster_home
    from dagster import DagsterInstance

    with warnings.catch_warnings():  # Dagster's beta / preview warnings about the definitions: noise in this report
        warnings.simplefilter("ignore")
        from engagement_platform.definitions import defs

    check_keys = sorted(defs.resolve_asset_graph().asset_check_keys, key=lambda k: k.to_user_string())
    with DagsterInstance.get() as instance:
        runs = instance.get_runs()
        status = {r.run_id: r.status.value for r in runs}
        attempts = Counter(
            (r.job_name, r.tags.get("dagster/partition")) for r in runs if r.tags.get("dagster/partition")
        )
        failed = [
            f"{r.job_name} {r.tags.get('dagster/partition', '')} {r.run_id[:8]}"
            + "".join(f" {t}={r.tags[t]}" for t in ("engagement/orphaned", "engagement/coordination") if t in r.tags)
            for r in runs
            if r.status.value in ("FAILURE", "CANCELED")
        ]
        evaluated, failing, warned, unevaluated = 0, [], [], []
        for key in check_keys:
            latest = {}
            for record in instance.event_log_storage.get_asset_check_execution_history(key, limit=1_000_000):
                latest.setdefault(record.partition, record)  # newest first
            for partition, record in sorted(latest.items(), key=lambda item: str(item[0])):
                evaluated += 1
                where = f"{key.to_user_string()} [{partition or '-'}]"
                evaluation = record.evaluation
                if record.status.value == "FAILED":
                    severity = getattr(getattr(evaluation, "severity", None), "value", "ERROR")
                    (warned if severity == "WARN" else failing).append(f"{where}: {severity}")
                elif record.status.value == "PLANNED" and status.get(record.run_id) not in (
                    None,
                    "STARTED",
                    "STARTING",
                ):
                    unevaluated.append(
                        f"{where}: planned by run {record.run_id[:8]} ({status.get(record.run_id)}), never evaluated"
                    )
        ticks, failed_ticks, paused = Counter(), Counter(), []
        for state in instance.all_instigator_state():
            history = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1_000_000)  # newest first
            ticks.update(tick.status.value for tick in history)
            failed_ticks.update(state.instigator_name for tick in history if tick.status.value == "FAILURE")
            reason = (history[0].skip_reason or "") if history else ""
            if (
                "paused" in reason
            ):  # a stream that stopped retrying waits for a person (docs/operations/runbook.md: resuming a paused stream)
                paused.append(f"{state.instigator_name}: {reason[:300]}")
        spans = run_spans(instance)
        slots = slot_usage(
            spans, max_concurrent_runs(instance), max((s.ended or s.created for s in spans), default=0.0)
        )
    return {
        "runs": Counter(f"{r.job_name}: {r.status.value}" for r in runs),
        "failed": failed,
        "ticks": ticks,
        "failed_ticks": failed_ticks,
        "paused": paused,
        "retried": sum(1 for n in attempts.values() if n > 1),
        "checks": evaluated,
        "failing": failing,
        "warnings": warned,
        "unevaluated": unevaluated,
        "slots": slots.lines(),
    }


def reconcile(
    messages,
    on_topic: Counter,
    faults: list[Fault],
    samples: list[Sample],
    caught_up: bool,
    failed_sends: list[str],
    incidents: list[str],
    env: dict[str, str],
    landed=(),
    window_s: float = 0.0,
) -> int:
    delivered, broker_notes, lost = as_delivered(messages, on_topic)
    lines, differences, unaccounted, problems = lake_diff(delivered, env["EP_LAKE_ROOT"], landed, lost)
    dagster = dagster_outcome(env["DAGSTER_HOME"])
    print("\n== faults ==")
    for line in summary(faults, samples, window_s):
        print("  " + line)
    for f in faults:
        resumed = resumed_after(f, samples) if f.cleared is not None else None
        print(
            f"    {f.kind} planned {f.planned:.0f} s, injected {f.injected and round(f.injected)}, cleared {f.cleared and round(f.cleared)}"
            f", hold {f.hold:.0f} s, back to committing {'-' if resumed is None else round(resumed)} s {f.detail}"
        )
    for line in incidents:
        print("  incident: " + line)
    print("\n== runs ==")
    for line, n in sorted(dagster["runs"].items()):
        print(f"  {line}: {n}")
    print(f"  failed runs {len(dagster['failed'])}, batches that took more than one run {dagster['retried']}")
    for line in dagster["failed"]:
        print("    failed: " + line)
    for line in dagster["slots"]:
        print("  " + line)
    print(
        f"  sensor and schedule ticks: {dict(sorted(dagster['ticks'].items()))}; failed ticks by sensor (faults make some): "
        f"{dict(sorted(dagster['failed_ticks'].items())) or 'none'}"
    )
    for line in dagster["paused"]:
        print("  PAUSED at the end: " + line)
    print(f"\n== checks: {dagster['checks']} (check, partition) latest evaluations ==")
    for label in ("failing", "unevaluated", "warnings"):
        for line in dagster[label]:
            print(f"  {label}: {line}")
    print("\n== tables ==")
    for line in lines:
        print("  " + line)
    for line in (
        broker_notes[:20] + failed_sends[:20]
    ):  # the broker's doing, not the platform's: the oracle used what it holds
        print("  broker (not counted: the oracle used what the topics hold): " + line)
    for line in unaccounted:
        print("  unaccounted: " + line)
    for line in problems:
        print("  workload assumption broken (the oracle is not exact here): " + line)
    verdict = {
        "not caught up within the bound": not caught_up,
        f"{differences} differences in the tables": differences > 0,
        f"{len(unaccounted)} records unaccounted for": bool(unaccounted),
        f"{len(dagster['failing'])} failing checks": bool(dagster["failing"]),
        f"{len(dagster['unevaluated'])} checks never evaluated": bool(dagster["unevaluated"]),
        f"{len(dagster['paused'])} streams paused after the faults cleared": bool(dagster["paused"]),
        f"{len(problems)} broken workload assumptions": bool(problems),
    }
    failed = [reason for reason, bad in verdict.items() if bad]
    print(
        f"\n{'FAIL: ' + '; '.join(failed) if failed else 'PASS'} ({len(messages)} messages, {sum(f.injected is not None for f in faults)} faults)"
    )
    return 1 if failed else 0
