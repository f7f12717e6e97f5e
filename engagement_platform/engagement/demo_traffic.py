"""The demo's engagement traffic on Kafka (`engagement-platform demo-produce`): activities at a steady rate, an ID
mutation request every so many activities and a retention or erasure request every so many more, each about
activities already sent (engagement/demo.py makes them)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from engagement_platform.engagement.demo import ActivityGenerator, GdprGenerator, MutationGenerator
from engagement_platform.settings import Settings
from engagement_platform.streams.kafka import KafkaClient, ReplacingProducer


@dataclass(frozen=True)
class DemoTraffic:
    rate: int  # activities per second
    count: int  # stop after this many (0: until interrupted)
    orgs: int
    bad_ratio: float
    seed: int
    mutations_every: int  # one ID mutation request per this many activities (0: none)
    gdpr_every: int  # one retention / erasure request per this many activities (0: none)


def produce_demo_traffic(settings: Settings, traffic: DemoTraffic, slice_seconds: float = 0.1) -> int:
    """Send the traffic until `count` or Ctrl-C; the number of activities sent.

    The messages due in each slice of `slice_seconds` go out together, with a linger of the same length: a sender
    that wakes per message makes the broker take a request per few messages, for the same traffic."""
    topic, mutations_topic, gdpr_topic = settings.ingestion.topic, settings.mutation.topic, settings.retention.topic
    gen = ActivityGenerator(seed=traffic.seed, orgs=traffic.orgs, bad_ratio=traffic.bad_ratio)
    mutator = MutationGenerator(seed=traffic.seed + 1)
    gdpr = GdprGenerator(seed=traffic.seed + 2)
    client = KafkaClient(settings.kafka_bootstrap_servers)
    linger_ms = max(int(slice_seconds * 1000), 20)
    producer = ReplacingProducer(
        lambda: client.producer(**{"linger.ms": linger_ms})
    )  # survives a broker that forgot it
    sent, started = 0, time.monotonic()
    print(f"producing ~{traffic.rate}/s engagement activities to {topic} (Ctrl-C stops)", flush=True)
    try:
        while traffic.count <= 0 or sent < traffic.count:
            if sent >= int((time.monotonic() - started + slice_seconds) * traffic.rate):
                producer.poll(0)
                time.sleep(slice_seconds)
                continue
            key, value = gen.message()
            producer.produce(topic, key=key, value=value)
            sent += 1
            if key != b"bad":
                record = json.loads(value)
                mutator.observe(record)
                gdpr.observe(record)
            if traffic.mutations_every and sent % traffic.mutations_every == 0:
                request = mutator.request(datetime.now(UTC))
                if request:
                    producer.produce(
                        mutations_topic, key=request["org_id"].encode(), value=json.dumps(request).encode()
                    )
            if traffic.gdpr_every and sent % traffic.gdpr_every == 0:
                request = gdpr.request(datetime.now(UTC))
                if request:
                    producer.produce(gdpr_topic, key=request["org_id"].encode(), value=json.dumps(request).encode())
            if sent % (traffic.rate * 30) == 0:
                print(f"produced {sent}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        producer.flush(10)
    return sent
