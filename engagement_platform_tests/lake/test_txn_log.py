"""Every app's txn version from the log in one pass (txn_log) against delta-rs's own answer, app by app, on real
Delta tables: commits of one batch and of many, checkpoints, log cleanup, tables asked at older versions, kept
answers brought forward, and a table replaced under the same path."""

import shutil
import tempfile

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engagement_platform.lake.delta import BatchTxn, DeltaLake, TableSpec
from engagement_platform.lake.txn_log import TxnLog

SPEC = TableSpec("txns", pa.schema([("app", pa.string()), ("batch", pa.int64())]), change_data_feed=False)
APPS = [f"app{i}" for i in range(6)]

operation = st.one_of(
    st.tuples(st.just("append"), st.lists(st.tuples(st.sampled_from(APPS), st.integers(0, 9)), min_size=1, max_size=4)),
    st.tuples(st.just("checkpoint"), st.none()),
    st.tuples(st.just("cleanup"), st.none()),
    st.tuples(st.just("ask"), st.integers(0, 20)),
)


def delta_rs_answer(lake: DeltaLake, version: int) -> dict[str, int]:
    table = lake.table(SPEC.name, version)
    return {app: v for app in APPS if (v := table.transaction_version(app)) is not None}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=12))
def test_the_log_read_once_gives_delta_rs_answer_for_every_app(operations):
    root = tempfile.mkdtemp(prefix="txn-log-")
    try:
        lake, log = DeltaLake(root), TxnLog()
        lake.ensure(SPEC)
        for kind, argument in operations:
            if kind == "append":
                # one commit carrying every batch's txn (a batch already in the table is left out)
                lake.append_many(
                    SPEC, [(BatchTxn(app, batch), {"app": app, "batch": batch}) for app, batch in argument]
                )
            elif kind == "checkpoint":
                lake.table(SPEC.name).create_checkpoint()
            elif kind == "cleanup":
                lake.expire_log(SPEC.name, 0)
            newest = lake.table(SPEC.name).version()
            asked = newest if kind != "ask" else min(argument, newest)
            kept = log.versions(lake.uri(SPEC.name), None, asked)  # brought forward from earlier answers
            fresh = TxnLog().versions(lake.uri(SPEC.name), None, asked)  # from the newest checkpoint, if any
            try:
                expected = delta_rs_answer(lake, asked)
            except Exception:  # noqa: BLE001 - the version's log was cleaned up: delta-rs cannot load it either
                continue
            for answer in (kept, fresh):
                if answer is not None or asked == newest:  # the newest version is always answered
                    assert answer == expected, (kind, asked, newest)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_table_replaced_under_the_same_path_is_read_afresh(tmp_path):
    lake, log = DeltaLake(str(tmp_path / "lake")), TxnLog()
    lake.ensure(SPEC)
    lake.append_many(SPEC, [(BatchTxn("a", 3), {"app": "a", "batch": 3})])
    assert log.versions(lake.uri(SPEC.name), None, 1) == {"a": 3}
    shutil.rmtree(tmp_path / "lake")
    lake.ensure(SPEC)
    lake.append_many(SPEC, [(BatchTxn("b", 1), {"app": "b", "batch": 1})])
    assert log.versions(lake.uri(SPEC.name), None, 1) == {"b": 1}


def test_a_commit_of_many_batches_asks_the_log_once_per_version(tmp_path):
    lake = DeltaLake(str(tmp_path / "lake"))
    lake.ensure(SPEC)
    written = lake.append_many(SPEC, [(BatchTxn(f"t{i}", 1), {"app": f"t{i}", "batch": 1}) for i in range(100)])
    assert written[0] == 1 and all(written[1])
    again = lake.append_many(SPEC, [(BatchTxn(f"t{i}", 1 + (i % 2)), {"app": f"t{i}", "batch": 1}) for i in range(100)])
    assert again[1] == [i % 2 == 1 for i in range(100)]  # the batches the table has are left out
