"""The layering rules, the history rule and the generated documents (scripts/architecture.py), checked on
every run: a broken rule, a stale picture of the tree or a stale reference (docs/reference/) fails here, not
in review."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _architecture():
    spec = importlib.util.spec_from_file_location("architecture", REPO / "scripts" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("architecture", module)  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_package_keeps_its_layering_rules():
    architecture = _architecture()
    assert architecture.problems(architecture.modules()) == []


def test_the_rules_catch_a_private_import_and_a_domain_importing_another(tmp_path):
    architecture = _architecture()
    package = tmp_path / "engagement_platform"
    for folder in ("", "lake", "engagement", "profiles"):
        (package / folder).mkdir(parents=True, exist_ok=True)
        (package / folder / "__init__.py").write_text("")
    (package / "lake" / "delta.py").write_text("import dagster\n\ndef _hidden():\n    pass\n")
    (package / "engagement" / "tables.py").write_text("from engagement_platform.lake.delta import _hidden\n")
    (package / "profiles" / "apply.py").write_text("from engagement_platform.engagement.tables import X\n")
    found = "\n".join(architecture.problems(architecture.modules(tmp_path), tmp_path))
    assert "imports the private name _hidden" in found
    assert "the framework layer lake imports dagster" in found
    assert "the domain profiles imports the domain engagement" in found


def test_the_generated_documents_and_references_match_the_code():
    """ARCHITECTURE.md's picture and layout, the README's layout, docs/reference/configuration.md (from
    settings.SETTINGS) and docs/reference/tables.md (from every TableSpec): each as the code generates it now."""
    architecture = _architecture()
    generated = {str(path.relative_to(REPO)) for path in architecture.generated()}
    assert {"docs/reference/configuration.md", "docs/reference/tables.md"} <= generated
    stale = architecture.stale()
    assert stale == [], f"stale: {stale}; regenerate with: {architecture.REGENERATE}"


def test_code_config_and_docs_name_no_session_run_issue_or_numbered_reference():
    """Which session, soak run or issue found something is history: CHANGELOG.md, docs/history/ and git keep it.
    Comments and docs say why the code is as it is, and name a reference design by its public title."""
    architecture = _architecture()
    assert architecture.history_mentions() == []


def test_the_history_rule_catches_history_and_passes_ordinary_words(tmp_path):
    architecture = _architecture()
    number = 25  # written apart, so this file itself passes the rule
    said = {
        "engagement_platform/lake/a.py": f"# found in session {number}\nx = 1  # soak run {number}: 3 s\n",
        "benchmarks/b.py": f'"""Throughput (issue #{number}, issues {number}-{number + 1})."""\n',
        "docs/guide.md": f"The design of Reference 00{number % 10}.\n",
        "README.md": f"As in reference\n00{number % 10}, session\n{number}.\n",
        "dagster.yaml": f"# Soak Run {number}\n",
    }
    harmless = {
        "engagement_platform/spark/session.py": '"""A Spark session per run; sessions expire; an issue with no number."""\n',
        "docs/concepts.md": "The reference designs, the 10 s session timeout, issue tracker, stop the stack.\n",
        "docs/history/notes.md": f"Found in session {number} (issue {number}).\n",
        "CHANGELOG.md": f"- Fixed in session {number}.\n",
        "engagement_platform/lake/c.pyc": f"session {number}",
    }
    for name, text in {**said, **harmless}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = architecture.history_mentions(tmp_path)
    where = {line.split(": names", 1)[0] for line in found}
    assert where == {
        "engagement_platform/lake/a.py:1",
        "engagement_platform/lake/a.py:2",
        "benchmarks/b.py:1",
        "docs/guide.md:1",
        "README.md:1",
        "README.md:2",
        "dagster.yaml:1",
    }, found
    assert len(found) == 8  # two on the benchmark's line
    assert all("history belongs in CHANGELOG.md, docs/history/" in line for line in found)


def test_every_module_the_docs_name_exists():
    """README and docs/ARCHITECTURE.md name modules by path (`engagement/mutation/apply.py`): each must exist,
    under the package or the repository, so the documents cannot point at code that moved."""
    import re

    missing = []
    for doc in (REPO / "README.md", REPO / "docs" / "ARCHITECTURE.md"):
        for path in sorted(set(re.findall(r"`([\w./-]+\.(?:py|yaml))`", doc.read_text()))):
            if "/" not in path or "*" in path or path.startswith(("acme_", "<")):
                continue
            if not any((base / path).exists() for base in (REPO, REPO / "engagement_platform")):
                missing.append(f"{doc.name}: {path}")
    assert missing == []
