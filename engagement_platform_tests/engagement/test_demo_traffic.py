"""The demo's traffic on the real broker: the activities asked for, requests about them, at the rate asked for."""

from __future__ import annotations

import json
import time
import uuid

from engagement_platform.engagement.demo_traffic import DemoTraffic, produce_demo_traffic
from engagement_platform.settings import load_settings


def test_the_demo_sends_the_activities_and_requests_asked_for_no_faster_than_its_rate(stack, kafka, monkeypatch):
    topics = {name: f"test.demo.{name}.{uuid.uuid4().hex[:8]}" for name in ("activities", "mutations", "gdpr")}
    kafka.create_topics({topic: 1 for topic in topics.values()})
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", stack["KAFKA_BOOTSTRAP_SERVERS"])
    monkeypatch.setenv("EP_ACTIVITIES_TOPIC", topics["activities"])
    monkeypatch.setenv("EP_MUTATIONS_TOPIC", topics["mutations"])
    monkeypatch.setenv("EP_GDPR_TOPIC", topics["gdpr"])
    traffic = DemoTraffic(rate=400, count=600, orgs=3, bad_ratio=0.0, seed=7, mutations_every=50, gdpr_every=300)
    started = time.monotonic()
    assert produce_demo_traffic(load_settings(), traffic, slice_seconds=0.1) == 600
    # The last slice may go up to one slice early: 600 at 400/s is never sent in under 1.5 - 0.1 s.
    assert time.monotonic() - started >= 1.4
    sent = {name: sum(h - lo for lo, h in kafka.watermarks(topic).values()) for name, topic in topics.items()}
    assert sent["activities"] == 600
    assert 0 < sent["mutations"] <= 600 // 50 and 0 < sent["gdpr"] <= 600 // 300, sent
    activities = [
        json.loads(m.value) for m in kafka.read_range(topics["activities"], _all(kafka, topics["activities"]))
    ]
    requests = [json.loads(m.value) for m in kafka.read_range(topics["mutations"], _all(kafka, topics["mutations"]))]
    assert len({a["engagement_id"] for a in activities}) == 600
    # Requests are about activities already sent: their orgs are the activities' orgs.
    assert {r["org_id"] for r in requests} <= {a["org_id"] for a in activities}


def _all(kafka, topic):
    from engagement_platform.streams.kafka import OffsetRange

    return [OffsetRange(p, lo, h) for p, (lo, h) in kafka.watermarks(topic).items()]
