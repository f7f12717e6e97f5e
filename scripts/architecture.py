"""The package's structure, read from the code: its layers, the imports between them, and the rules
they keep. It writes the layer picture (a Mermaid flowchart GitHub renders) and the package layout into
docs/ARCHITECTURE.md and the README between marker comments, and checks the rules.

    .venv/bin/python scripts/architecture.py            # rewrite the generated sections
    .venv/bin/python scripts/architecture.py --check    # exit 1 if they are stale or a rule is broken

The test suite runs the check (engagement_platform_tests/test_architecture.py), so the documents follow
the tree and a broken rule fails CI.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "engagement_platform"
MAX_LINES = 350
LONG_MARK = "Long by design:"  # a module over MAX_LINES says why in its docstring, after this mark
HISTORY_OWNER = f"{PACKAGE}.lake.delta"  # the one module that calls delta-rs's DeltaTable.history

# Layer of each top-level unit, lowest first; a unit may import its own layer and those below.
FRAMEWORK = ("settings", "lake", "streams", "spark", "ingest")
DAGSTER_SIDE = ("orchestration", "resources")
DOMAINS = ("engagement", "profiles", "landing")
ASSEMBLY = ("catalog", "definitions", "cli")
DAGSTER_MODULES = ("assets", "sensors", "jobs", "checks", "partitions")
LAYER_TITLES = {
    "framework": "Stream framework (no Dagster)",
    "dagster": "Dagster side of the framework",
    "domains": "Lakes: one package per stream",
    "assembly": "Assembly",
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted
    path: Path
    tree: ast.Module
    lines: int

    @property
    def unit(self) -> str:
        parts = self.name.split(".")
        return parts[1] if len(parts) > 1 else ""

    @property
    def node(self) -> str:
        """The box it belongs to in the picture: a stream package inside a lake, else its top-level unit."""
        parts = self.name.split(".")
        if (
            len(parts) > 3
            and parts[1] in DOMAINS
            and (self.path.parent / "__init__.py").exists()
            and parts[2] not in DAGSTER_MODULES
        ):
            return ".".join(parts[1:3])
        return parts[1] if len(parts) > 1 else ""


def modules(root: Path = REPO) -> list[Module]:
    found = []
    for path in sorted((root / PACKAGE).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        text = path.read_text()
        found.append(Module(".".join(parts), path, ast.parse(text), len(text.splitlines())))
    return found


def imports(module: Module) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every import of this package, at any depth."""
    out = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.extend((node.module, a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, "", node.lineno) for a in node.names)
    return out


def unit_of(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else ""


def problems(mods: list[Module], root: Path = REPO) -> list[str]:
    """Every broken rule, one line each: `<file>:<line>: <rule>`."""
    names = {m.name for m in mods}
    out = []
    for m in mods:
        where = m.path.relative_to(root)
        stem = m.name.rsplit(".", 1)[-1]
        for target, name, line in imports(m):
            here = f"{where}:{line}"
            if target.split(".")[0] == PACKAGE:
                full = f"{target}.{name}"
                if name.startswith("_") and full not in names:
                    out.append(f"{here}: imports the private name {name} from {target}")
                dst = unit_of(target if full not in names else full)
                src = m.unit
                if src in FRAMEWORK and dst and dst not in FRAMEWORK:
                    out.append(f"{here}: the framework layer {src} imports {dst}")
                if src in DAGSTER_SIDE and dst in DOMAINS + ASSEMBLY:
                    out.append(f"{here}: {src} (Dagster side of the framework) imports {dst}")
                if src in DOMAINS and dst in DOMAINS and dst != src:
                    out.append(f"{here}: the domain {src} imports the domain {dst}")
                if src in DOMAINS + FRAMEWORK and dst in ASSEMBLY:
                    out.append(f"{here}: {src} imports {dst}, which assembles the platform")
                if src in DOMAINS and stem not in DAGSTER_MODULES and dst in DAGSTER_SIDE:
                    out.append(f"{here}: pure logic ({m.name}) imports {dst}")
            elif target.split(".")[0] in ("dagster", "dagster_pyspark"):
                if m.unit in FRAMEWORK:
                    out.append(f"{here}: the framework layer {m.unit} imports dagster")
                if m.unit in DOMAINS and stem not in DAGSTER_MODULES:
                    out.append(
                        f"{here}: pure logic ({m.name}) imports dagster; Dagster code goes in {'/'.join(DAGSTER_MODULES)}"
                    )
        doc = ast.get_docstring(m.tree) or ""
        if m.lines > MAX_LINES and LONG_MARK not in doc:
            out.append(
                f"{where}: {m.lines} lines (over {MAX_LINES}) and its docstring does not say why ('{LONG_MARK} ...')"
            )
        text = m.path.read_text()
        if m.name != HISTORY_OWNER:
            for node in ast.walk(m.tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "history"
                    and not is_lake(node.func.value)
                ):
                    out.append(
                        f"{where}:{node.lineno}: reads a table's history itself; use DeltaLake.history (delta-rs numbers "
                        "commits from the loaded version: a concurrent commit shifts them)"
                    )
        for match in re.finditer(r"\b[Ii]ssues? \d+\b", text):
            out.append(
                f"{where}:{text.count(chr(10), 0, match.start()) + 1}: names '{match.group(0)}' (history belongs in git)"
            )
    return out


def is_lake(receiver: ast.expr) -> bool:
    """Whether a `.history(...)` call is on a DeltaLake, by the platform's names for one (`lake`, `store`, `x.lake`)."""
    name = (
        receiver.id if isinstance(receiver, ast.Name) else receiver.attr if isinstance(receiver, ast.Attribute) else ""
    )
    return name in ("lake", "store")


def layer_of(unit: str) -> str:
    if unit in FRAMEWORK:
        return "framework"
    if unit in DAGSTER_SIDE:
        return "dagster"
    if unit in DOMAINS:
        return "domains"
    return "assembly"


def picture(mods: list[Module]) -> str:
    """A Mermaid flowchart: one box per unit (per stream package inside a lake), an arrow per import
    between boxes of different units, grouped by layer."""
    by_name = {m.name: m for m in mods}
    nodes = sorted({m.node for m in mods if m.node})
    edges = set()
    for m in mods:
        for target, name, _ in imports(m):
            if target.split(".")[0] != PACKAGE:
                continue
            dst = by_name.get(f"{target}.{name}") or by_name.get(target)
            if dst is None or not dst.node or dst.node == m.node or not m.node:
                continue
            src_unit, dst_unit = m.node.split(".")[0], dst.node.split(".")[0]
            if src_unit == dst_unit and "." not in dst.node:
                continue  # a stream package using its lake's shared modules: implied by the nesting
            edges.add((m.node, dst.node if src_unit != dst_unit or "." in dst.node else dst_unit))
    # Arrows into the framework from above are implied by the layering; draw only those between
    # boxes of the same layer and from the Dagster side and assembly, so the picture stays legible.
    ident = {n: n.replace(".", "_") for n in nodes}
    lines = ["```mermaid", "flowchart TB"]
    for layer in ("assembly", "domains", "dagster", "framework"):
        members = [n for n in nodes if layer_of(n.split(".")[0]) == layer]
        lines.append(f'  subgraph {layer}["{LAYER_TITLES[layer]}"]')
        if layer == "domains":
            for lake in DOMAINS:
                inner = [n for n in members if n.split(".")[0] == lake]
                lines.append(f'    subgraph {lake}_lake["{lake}"]')
                lines.extend(
                    f'      {ident[n]}["{n.split(".")[-1] if "." in n else lake + " (shared)"}"]' for n in inner
                )
                lines.append("    end")
        else:
            lines.extend(f'    {ident[n]}["{n}"]' for n in members)
        lines.append("  end")
    for src, dst in sorted(edges):
        s, d = layer_of(src.split(".")[0]), layer_of(dst.split(".")[0])
        if s == d or s in ("assembly", "dagster") and d != "framework":
            lines.append(f"  {ident[src]} --> {ident[dst]}")
    lines.append("  assembly --> domains --> dagster --> framework")
    lines.append("```")
    return "\n".join(lines)


def layout(root: Path = REPO) -> str:
    """The package tree with each package's one-line docstring, as a code block."""
    rows = []
    base = root / PACKAGE
    for init in sorted(base.rglob("__init__.py")):
        folder = init.parent
        depth = len(folder.relative_to(root).parts) - 1
        doc = (ast.get_docstring(ast.parse(init.read_text())) or "").split("\n")[0]
        name = folder.name + "/"
        rows.append((depth, name, doc))
        if folder == base:
            for top in sorted(p for p in folder.glob("*.py") if p.name != "__init__.py"):
                first = (ast.get_docstring(ast.parse(top.read_text())) or "").split("\n")[0]
                rows.append((1, top.name, first))
    width = max(2 * d + len(n) for d, n, _ in rows) + 2
    lines = ["```"]
    lines.extend(f"{'  ' * d}{n}".ljust(width) + doc for d, n, doc in rows)
    lines.append("```")
    return "\n".join(lines)


def replace_between(text: str, tag: str, body: str) -> str:
    begin, end = f"<!-- {tag}:begin (scripts/architecture.py) -->", f"<!-- {tag}:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"markers for {tag} missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def generated(root: Path = REPO) -> dict[Path, str]:
    mods = modules(root)
    out = {}
    arch = root / "docs" / "ARCHITECTURE.md"
    out[arch] = replace_between(replace_between(arch.read_text(), "layers", picture(mods)), "layout", layout(root))
    readme = root / "README.md"
    out[readme] = replace_between(readme.read_text(), "layout", layout(root))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a generated section is stale or a rule is broken"
    )
    args = parser.parse_args()
    broken = problems(modules())
    for line in broken:
        print(line)
    stale = [path for path, text in generated().items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)}: generated sections are stale: run scripts/architecture.py")
        return 1 if broken or stale else 0
    for path, text in generated().items():
        path.write_text(text)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
