"""Fixtures of the landing tests."""

import pytest


@pytest.fixture
def landing(tmp_path, monkeypatch):
    """The rewards_members pipeline's landing folder, under a landing root of this test's own (EP_LANDING_ROOT)."""
    root = tmp_path / "landing"
    (root / "rewards_members").mkdir(parents=True)
    monkeypatch.setenv("EP_LANDING_ROOT", str(root))
    return root / "rewards_members"
