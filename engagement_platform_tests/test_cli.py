import os
import subprocess
import sys
import uuid

from engagement_platform.cli import PARTITIONS


def test_create_topics_creates_the_topics_the_streams_are_configured_to_read(kafka, stack):
    suffix = uuid.uuid4().hex[:8]
    names = {f"EP_{stream.upper()}_TOPIC": f"test.cli.{stream}.{suffix}" for stream in PARTITIONS}
    env = {**os.environ, **stack, **names}
    done = subprocess.run([sys.executable, "-m", "engagement_platform.cli", "create-topics"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    created = {names[f"EP_{stream.upper()}_TOPIC"]: len(kafka.partitions(names[f"EP_{stream.upper()}_TOPIC"])) for stream in PARTITIONS}
    assert created == {names[f"EP_{stream.upper()}_TOPIC"]: n for stream, n in PARTITIONS.items()}
    assert all(name in done.stdout for name in names.values())
