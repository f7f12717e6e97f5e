"""The package's structure, read from the code: its layers, the imports between them, and the rules
they keep. It writes the layer picture (a Mermaid flowchart GitHub renders) and the package layout into
docs/ARCHITECTURE.md and the README between marker comments, the configuration reference from
settings.SETTINGS and the table reference from every TableSpec of the package (docs/reference/), and
checks the rules: the layering, and no history (which session, soak run, issue or numbered reference found
what) in code, config or docs outside CHANGELOG.md and docs/history/.

    .venv/bin/python scripts/architecture.py            # rewrite the generated sections and references
    .venv/bin/python scripts/architecture.py --check    # exit 1 if they are stale or a rule is broken

The test suite runs the check (engagement_platform_tests/test_architecture.py), so the documents follow
the tree and a broken rule fails CI.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import pkgutil
import re
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "engagement_platform"
MAX_LINES = 450  # lines as ruff formats them (120 columns)
LONG_MARK = "Long by design:"  # a module over MAX_LINES says why in its docstring, after this mark
HISTORY_OWNER = f"{PACKAGE}.lake.delta"  # the one module that calls delta-rs's DeltaTable.history

# Layer of each top-level unit, lowest first; a unit may import its own layer and those below.
FRAMEWORK = ("settings", "lake", "streams", "spark", "ingest")
DAGSTER_SIDE = ("orchestration", "resources")
DOMAINS = ("engagement", "profiles", "landing")
ASSEMBLY = ("registry", "definitions", "cli")
DAGSTER_MODULES = ("assets", "sensors", "jobs", "checks", "partitions")
REGENERATE = ".venv/bin/python scripts/architecture.py"
# History names what found something, not why the code is as it is: it belongs in CHANGELOG.md, docs/history/
# and git. A number after the word is what makes it history ("a Spark session", "issues" and "the reference
# designs" pass); the reference designs are named by their public titles instead of their file numbers.
HISTORY_MENTION = re.compile(r"\b(?:sessions?|soak\s+runs?|issues?)\s+#?\d+|\breferences?\s+0\d\d", re.IGNORECASE)
HISTORY_TREES = ("engagement_platform", "engagement_platform_tests", "benchmarks", "scripts", "pipelines", "segments")
HISTORY_FILES = (
    "README.md",
    "BENCHMARKS.md",
    "dagster.yaml",
    "setup.cfg",
    "pyproject.toml",
    "workspace.yaml",
    "constraints.txt",
)
HISTORY_DOCS, HISTORY_KEPT = "docs", "docs/history"
TEXT_SUFFIXES = (".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".ini", ".properties")
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
    return out


def history_rule_files(root: Path = REPO) -> list[Path]:
    """The code, config and docs the history rule reads: not CHANGELOG.md, not docs/history/."""
    found = [root / name for name in HISTORY_FILES if (root / name).is_file()]
    for tree in (*HISTORY_TREES, HISTORY_DOCS):
        found.extend(
            path
            for path in sorted((root / tree).rglob("*"))
            if path.is_file()
            and path.suffix in TEXT_SUFFIXES
            and "__pycache__" not in path.parts
            and not path.relative_to(root).as_posix().startswith(f"{HISTORY_KEPT}/")
        )
    return found


def history_mentions(root: Path = REPO) -> list[str]:
    """Every mention of which session, soak run, issue or numbered reference found something: `<file>:<line>: ...`."""
    out = []
    for path in history_rule_files(root):
        text = path.read_text(errors="replace")
        for match in HISTORY_MENTION.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            said = " ".join(match.group(0).split())
            out.append(
                f"{path.relative_to(root)}:{line}: names '{said}' (history belongs in CHANGELOG.md, docs/history/ "
                "or git; say why the code is as it is, and name a reference design by its title)"
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


# ---- generated references ------------------------------------------------------------------------

REFERENCE = Path("docs") / "reference"
GENERATED_NOTE = "<!-- generated by scripts/architecture.py from {source}: edit the code, not this file -->"
SECTION_TITLES = {
    "storage": "Storage",
    "kafka": "Kafka and batch size (every Kafka stream)",
    "coordinator": "Job coordinator (ZooKeeper)",
    "spark": "Spark",
    "ingestion": "Ingestion stream",
    "mutation": "Mutation stream",
    "retention": "Retention stream",
    "erasure": "Erasure (every lake)",
    "profiles": "Profile lake streams",
    "object store": "Object store (S3, ADLS / Azure Blob)",
    "testing hooks": "Testing hooks (unset in operation)",
}


def package_module(name: str, root: Path = REPO) -> ModuleType:
    """A module of the package, imported from this checkout."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(name)


def cell(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes escaped, and angle brackets outside code spans
    escaped (GitHub drops `<tenant>` as an unknown HTML tag)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def shown_default(default: str | None) -> str:
    """How the reference shows a declared default ("{repo}" is the checkout; unset: no default)."""
    if default is None:
        return "unset"
    return f"`{default.replace('{repo}', '<repo>').replace('{EP_STATE_DIR}', '$EP_STATE_DIR')}`"


def configuration(root: Path = REPO) -> str:
    """docs/reference/configuration.md: every variable of settings.SETTINGS, a table per section."""
    settings = package_module(f"{PACKAGE}.settings", root)
    lines = [
        "# Configuration reference",
        "",
        GENERATED_NOTE.format(source="engagement_platform/settings.py (SETTINGS)"),
        "",
        "Every environment variable the platform reads, with its default and what it does. The defaults point at",
        "the local stack (`scripts/stack.sh`). A variable with a default may stay unset in every entry point:",
        "`scripts/run_platform.sh`, `dagster dev` started by hand and the `engagement-platform` CLI read the same",
        "settings when a run or a sensor tick needs them. An empty value counts as unset, except where the table",
        "says what empty means. `<repo>` is the folder of this checkout.",
        "",
        "The scripts read a few variables of their own (the local stack's ports, `EP_DEMO_STORE`,",
        "`EP_DAGSTER_PORT`): each script's header lists them. Dagster itself reads `DAGSTER_HOME`.",
    ]
    sections: dict[str, list[Any]] = {}
    for setting in settings.SETTINGS:
        sections.setdefault(setting.section, []).append(setting)
    for section, members in sections.items():
        lines += ["", f"## {SECTION_TITLES.get(section, section.capitalize())}", ""]
        lines += ["| variable | default | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{s.name}` | {shown_default(s.default)} | {cell(s.help)} |" for s in members]
    return "\n".join(lines) + "\n"


def assigned_names(tree: ast.Module) -> dict[str, ast.stmt]:
    """Module-level names bound by an assignment or a function definition, to their statement."""
    out: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            out.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, ast.FunctionDef):
            out[node.name] = node
    return out


COLUMN_NOTE = re.compile(r"""(?:\(\s*"(\w+)"\s*,|"(\w+)"\s*:)[^#\n]*#\s*(.+)""")


def imported_names(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Module-level `from X import Y as Z`: Z -> (X, Y)."""
    return {
        alias.asname or alias.name: (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for alias in node.names
    }


def column_notes(module: ModuleType, name: str) -> dict[str, str]:
    """The comments written beside a table's columns: in the statement that binds `name` in `module`, then in
    the statements of the names it uses (in this package, followed through imports), nearest first."""
    notes: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    todo = [(module.__name__, name)]
    while todo:
        module_name, bound = todo.pop(0)
        if (module_name, bound) in seen or not module_name.startswith(f"{PACKAGE}."):
            continue
        seen.add((module_name, bound))
        source = Path(importlib.import_module(module_name).__file__ or "").read_text()
        tree = ast.parse(source)
        node = assigned_names(tree).get(bound)
        if node is None:
            if bound in imported_names(tree):
                todo.append(imported_names(tree)[bound])
            continue
        segment = ast.get_source_segment(source, node) or ""
        for match in COLUMN_NOTE.finditer(segment):
            notes.setdefault(match.group(1) or match.group(2), match.group(3).strip())
        todo += [(module_name, n.id) for n in ast.walk(node) if isinstance(n, ast.Name) and n.id != bound]
    return notes


@dataclass(frozen=True)
class DeclaredTable:
    spec: Any  # a TableSpec
    module: ModuleType
    name: str  # what binds it in `module`
    scope: str = ""  # a table per tenant or per pipeline: says so


def declared_tables(root: Path = REPO) -> list[DeclaredTable]:
    """Every TableSpec bound at module level where it is declared (imports elsewhere skipped), in package
    order with each lake's own tables.py first, then the tables made per tenant (profiles' raw tables) and
    per ingest pipeline (those of the shipped pipelines/)."""
    package = package_module(PACKAGE, root)
    delta = package_module(f"{PACKAGE}.lake.delta", root)
    found, names = [], set()
    for info in pkgutil.walk_packages(package.__path__, f"{PACKAGE}."):
        with warnings.catch_warnings():  # Dagster's beta notices, once per import: nothing to act on here
            warnings.simplefilter("ignore")
            module = importlib.import_module(info.name)
        bound = assigned_names(ast.parse(Path(module.__file__ or "").read_text()))
        for name in sorted(bound, key=lambda bound_name: bound[bound_name].lineno):
            spec = getattr(module, name, None)
            if isinstance(spec, delta.TableSpec) and spec.name not in names:
                names.add(spec.name)
                found.append(DeclaredTable(spec, module, name))
    units = list(dict.fromkeys(t.module.__name__.split(".")[1] for t in found))
    found.sort(key=lambda t: (units.index(t.module.__name__.split(".")[1]), t.module.__name__.count(".") > 2))
    profiles = package_module(f"{PACKAGE}.profiles.tables", root)
    sample = "x-tenant-x"  # a valid tenant name, shown as <tenant>
    raw = profiles.raw_table_spec(sample)
    shown = replace(
        raw, name=raw.name.replace(sample, "<tenant>"), description=raw.description.replace(sample, "<tenant>")
    )
    found.append(DeclaredTable(shown, profiles, "raw_table_spec", "tenant"))
    config, tables = package_module(f"{PACKAGE}.ingest.config", root), package_module(f"{PACKAGE}.ingest.tables", root)
    for path in sorted((root / "pipelines").glob("*.y*ml")):
        pipeline = config.load_pipeline(path)
        for make in (tables.target_spec, tables.quarantine_spec):
            found.append(DeclaredTable(make(pipeline), tables, make.__name__, f"pipelines/{path.name}"))
    return found


def tables_reference(root: Path = REPO) -> str:
    """docs/reference/tables.md: every Delta table the platform writes, by the package that declares it."""
    default_stats = package_module(f"{PACKAGE}.lake.file_writes", root).DEFAULT_STATS_COLUMNS
    lines = [
        "# Table reference",
        "",
        GENERATED_NOTE.format(source="the TableSpec declarations of engagement_platform/"),
        "",
        "Every Delta table the platform writes: what a row is, how the table is partitioned, whether it keeps a",
        "change data feed, its columns and their Arrow types. Tables live under `EP_LAKE_ROOT`, each in the folder",
        "of its name. A table per tenant or per ingest pipeline says so; the pipeline tables shown are those of the",
        "shipped `pipelines/` folder (every pipeline file adds its own pair).",
    ]
    current = None
    for table in declared_tables(root):
        unit = table.module.__name__.split(".")[1]
        if unit != current:
            current = unit
            doc = (inspect.getdoc(package_module(f"{PACKAGE}.{unit}", root)) or "").split("\n")[0]
            lines += ["", f"## {unit}/", "", doc]
        spec, where = table.spec, Path(table.module.__file__ or "").relative_to(root / PACKAGE).as_posix()
        made = f"`{table.name}(...)`" if table.scope else f"`{table.name}`"
        facts = [
            f"partitioned by {', '.join(f'`{c}`' for c in spec.partition_by)}"
            if spec.partition_by
            else "unpartitioned",
            f"change data feed {'on' if spec.change_data_feed else 'off'}",
            "statistics on "
            + (", ".join(f"`{c}`" for c in spec.stats_columns) or f"the first {default_stats} data columns"),
            f"declared in `{where}` ({made})",
        ]
        if table.scope:
            facts.insert(0, f"one per {table.scope}" if "/" not in table.scope else f"from `{table.scope}`")
        lines += ["", f"### `{spec.name}`", "", cell(spec.description or "(no description)"), ""]
        summary = cell("; ".join(facts))
        lines += [summary[:1].upper() + summary[1:] + ".", "", "| column | type | note |", "| --- | --- | --- |"]
        notes = column_notes(table.module, table.name)
        lines += [f"| `{f.name}` | `{f.type}` | {cell(notes.get(f.name, ''))} |" for f in spec.schema]
    return "\n".join(lines) + "\n"


def replace_between(text: str, tag: str, body: str) -> str:
    begin, end = f"<!-- {tag}:begin (scripts/architecture.py) -->", f"<!-- {tag}:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"markers for {tag} missing")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def generated(root: Path = REPO) -> dict[Path, str]:
    """Each generated file and the text it must have: ARCHITECTURE.md's sections, the README's layout (when
    the README has its markers) and the references under docs/reference/."""
    mods = modules(root)
    out = {}
    arch = root / "docs" / "ARCHITECTURE.md"
    out[arch] = replace_between(replace_between(arch.read_text(), "layers", picture(mods)), "layout", layout(root))
    readme = root / "README.md"
    if "<!-- layout:begin" in readme.read_text():
        out[readme] = replace_between(readme.read_text(), "layout", layout(root))
    out[root / REFERENCE / "configuration.md"] = configuration(root)
    out[root / REFERENCE / "tables.md"] = tables_reference(root)
    return out


def stale(root: Path = REPO) -> list[str]:
    """The generated files whose text differs from what the code generates, relative to the checkout."""
    return [
        str(path.relative_to(root))
        for path, text in generated(root).items()
        if not path.exists() or path.read_text() != text
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if a generated section is stale or a rule is broken"
    )
    args = parser.parse_args()
    broken = problems(modules()) + history_mentions()
    for line in broken:
        print(line)
    if args.check:
        outdated = stale()
        for path in outdated:
            print(f"{path}: generated text is stale: run {REGENERATE}")
        return 1 if broken or outdated else 0
    for path, text in generated().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
