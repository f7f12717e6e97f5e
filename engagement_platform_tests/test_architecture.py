"""The layering rules and the generated architecture documents (scripts/architecture.py), checked on
every run: a broken rule or a stale picture of the tree fails here, not in review."""

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
    (package / "profiles" / "apply.py").write_text("from engagement_platform.engagement.tables import X  # issue 7\n")
    found = "\n".join(architecture.problems(architecture.modules(tmp_path), tmp_path))
    assert "imports the private name _hidden" in found
    assert "the framework layer lake imports dagster" in found
    assert "the domain profiles imports the domain engagement" in found
    assert "names 'issue 7'" in found


def test_the_generated_documents_match_the_tree():
    architecture = _architecture()
    stale = [str(path.relative_to(REPO)) for path, text in architecture.generated().items() if path.read_text() != text]
    assert stale == [], "run: .venv/bin/python scripts/architecture.py"


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
