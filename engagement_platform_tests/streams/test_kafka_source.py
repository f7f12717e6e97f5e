import json

from pyspark.sql import functions as F


def test_spark_reads_exact_offset_ranges_through_the_data_source(spark, kafka, topic):
    for p in range(3):
        kafka.produce(topic, [(None, f"{p}:{i}".encode()) for i in range(400)], partition=p)
    ranges = [[0, 0, 400], [1, 100, 250], [2, 399, 400]]
    df = (
        spark.read.format("kafka_offsets")
        .option("bootstrap_servers", kafka.bootstrap_servers)
        .option("topic", topic)
        .option("ranges", json.dumps(ranges))
        .option("slice_size", "90")  # several input partitions per Kafka partition
        .load()
    )
    rows = df.select("kafka_partition", "kafka_offset", F.col("value").cast("string").alias("v")).toArrow().to_pylist()
    expected = {(p, o) for p, s, e in ranges for o in range(s, e)}
    assert len(rows) == len(expected)
    assert {(r["kafka_partition"], r["kafka_offset"]) for r in rows} == expected
    assert all(r["v"] == f"{r['kafka_partition']}:{r['kafka_offset']}" for r in rows)
