import os
import subprocess
import sys
import uuid

from engagement_platform.cli import PARTITIONS


def test_create_topics_creates_the_topics_the_streams_are_configured_to_read(kafka, stack):
    suffix = uuid.uuid4().hex[:8]
    names = {f"EP_{stream.upper()}_TOPIC": f"test.cli.{stream}.{suffix}" for stream in PARTITIONS}
    env = {**os.environ, **stack, **names}
    done = subprocess.run(
        [sys.executable, "-m", "engagement_platform.cli", "create-topics"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    created = {
        names[f"EP_{stream.upper()}_TOPIC"]: len(kafka.partitions(names[f"EP_{stream.upper()}_TOPIC"]))
        for stream in PARTITIONS
    }
    assert created == {names[f"EP_{stream.upper()}_TOPIC"]: n for stream, n in PARTITIONS.items()}
    assert all(name in done.stdout for name in names.values())


def topic_retention_ms(kafka, topic: str) -> str:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    return future.result(30)["retention.ms"].value


def test_create_topics_bounds_retention_on_new_and_existing_topics(kafka, stack):
    """The demo's topics keep a bounded window (run_platform.sh: 10 minutes); a second call sets it on topics an
    earlier run created without it."""
    topic = f"test.cli.activities.{uuid.uuid4().hex[:8]}"
    env = {**os.environ, **stack, "EP_ACTIVITIES_TOPIC": topic}

    def run(*extra):
        return subprocess.run(
            [sys.executable, "-m", "engagement_platform.cli", "create-topics", *extra],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert run().returncode == 0
    assert topic_retention_ms(kafka, topic) != str(5 * 60_000)
    done = run("--retention-minutes", "5")
    assert done.returncode == 0 and "messages kept 5 min" in done.stdout, done.stdout + done.stderr
    assert topic_retention_ms(kafka, topic) == str(5 * 60_000)
