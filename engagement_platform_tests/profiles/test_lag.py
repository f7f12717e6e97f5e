"""CDC lag (Kafka messages not staged) and replication lag (staged vs merged CDC time) per tenant,
from metadata only, against the real broker, Spark and Delta."""

from engagement_platform.profiles.lag import staged_offsets, tenant_lags, topic_lag
from engagement_platform.profiles.processor.apply import process_tenant
from engagement_platform.profiles.staging.apply import STREAM
from engagement_platform_tests.support.cdc import encode, new_topic, plan_all, record, stage


def test_topic_lag_counts_messages_after_the_last_finished_dumper_batch(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka, partitions=2)
    assert staged_offsets(checkpoints) == {}
    assert topic_lag(kafka.watermarks(topic), {}) == {0: 0, 1: 0}
    first = stage(spark, kafka, lake, checkpoints, topic, [record("acme", str(i), i, {}) for i in range(6)])
    assert staged_offsets(checkpoints) == first.plan.ends()
    for i in range(5):
        kafka.produce(topic, encode([record("acme", f"n{i}", 10 + i, {})]), partition=i % 2)
    assert topic_lag(kafka.watermarks(topic), staged_offsets(checkpoints)) == {0: 3, 1: 2}
    plan_all(kafka, checkpoints, topic)  # planned, not staged yet: still lag
    assert staged_offsets(checkpoints) == first.plan.ends()
    assert sum(topic_lag(kafka.watermarks(topic), staged_offsets(checkpoints)).values()) == 5


def test_replication_lag_is_newest_staged_minus_newest_merged_cdc_time(spark, kafka, lake, checkpoints):
    topic = new_topic(kafka)
    assert tenant_lags(lake) == {}
    stage(
        spark,
        kafka,
        lake,
        checkpoints,
        topic,
        [
            record("acme", "1", 1, {}, ts="2026-01-05T10:00:00Z"),
            record("acme", "2", 2, {}, ts="2026-01-05T10:20:00Z"),
            record("globex", "1", 1, {}, ts="2026-01-05T11:00:00Z"),
        ],
    )
    lags = tenant_lags(lake)
    # Never processed: from the oldest staged change.
    assert (lags["acme"].staged_unprocessed, lags["acme"].replication_lag_seconds) == (2, 1200.0)
    assert (lags["globex"].staged_unprocessed, lags["globex"].replication_lag_seconds) == (1, 0.0)

    process_tenant(spark, lake, checkpoints, "acme")
    acme = tenant_lags(lake)["acme"]
    assert (acme.staged_unprocessed, acme.replication_lag_seconds) == (0, 0.0)
    assert acme.max_processed_ts == acme.max_staged_ts

    # Two batches staged after the merge: changes 45 minutes newer (another bucket), one late and older.
    stage(spark, kafka, lake, checkpoints, topic, [record("acme", "3", 3, {}, ts="2026-01-05T11:05:00Z")])
    stage(spark, kafka, lake, checkpoints, topic, [record("acme", "4", 4, {}, ts="2026-01-05T09:00:00Z")])
    acme = tenant_lags(lake)["acme"]
    assert (acme.staged_records, acme.staged_unprocessed, acme.replication_lag_seconds) == (4, 2, 2700.0)
    assert acme.metadata()["replication_lag_seconds"] == 2700.0
    assert tenant_lags(lake, ["globex", "initech"])["initech"].staged_records == 0
    assert checkpoints.latest(STREAM)[1]
