"""Topics of the retention tests (the activity topic and the stack come from the root conftest)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def gdpr_topic(kafka) -> str:
    name = f"test.gdpr.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: 1})
    return name


@pytest.fixture
def mutation_topic(kafka) -> str:
    name = f"test.mutations.{uuid.uuid4().hex[:10]}"
    kafka.create_topics({name: 3})
    return name
