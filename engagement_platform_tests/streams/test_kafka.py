from engagement_platform.streams.kafka import OffsetRange


def test_watermarks_match_delivery_reports(kafka, topic):
    delivered = kafka.produce(topic, [(str(i % 7).encode(), f"m{i}".encode()) for i in range(3000)])
    marks = kafka.watermarks(topic)
    assert sorted(marks) == [0, 1, 2]
    assert {p: high for p, (_, high) in marks.items() if high} == delivered
    assert sum(high for _, high in marks.values()) == 3000


def test_read_range_returns_exactly_the_range_in_order(kafka, topic):
    kafka.produce(topic, [(None, f"v{i}".encode()) for i in range(500)], partition=1)
    got = list(kafka.read_range(topic, [OffsetRange(1, 120, 380)]))
    assert [m.offset for m in got] == list(range(120, 380))
    assert [m.value for m in got] == [f"v{i}".encode() for i in range(120, 380)]
    assert {m.partition for m in got} == {1}


def test_read_range_of_several_partitions_and_empty_ranges(kafka, topic):
    for p in range(3):
        kafka.produce(topic, [(None, f"p{p}-{i}".encode()) for i in range(50)], partition=p)
    got = list(kafka.read_range(topic, [OffsetRange(0, 0, 50), OffsetRange(1, 10, 10), OffsetRange(2, 45, 50)]))
    by_partition = {p: [m.offset for m in got if m.partition == p] for p in range(3)}
    assert by_partition == {0: list(range(50)), 1: [], 2: list(range(45, 50))}
