"""The plugin registry: built-in converters and validators, plus those other packages register through
the entry point groups `engagement_platform.converters` / `engagement_platform.validators`
(name = plugin name, value = "module:Class")."""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Literal, overload

from pydantic import ValidationError

from engagement_platform.ingest import builtin
from engagement_platform.ingest.plugins import Converter, Plugin, Validator

if TYPE_CHECKING:
    from engagement_platform.ingest.config import ColumnSpec, PipelineConfig, PluginRef

CONVERTER_GROUP = "engagement_platform.converters"
VALIDATOR_GROUP = "engagement_platform.validators"


def registry() -> dict[str, dict[str, type[Plugin] | EntryPoint]]:
    """{"converters": name -> class, "validators": name -> class}: built-ins, then entry points (not loaded yet)."""
    found: dict[str, dict[str, type[Plugin] | EntryPoint]] = {
        "converters": dict(builtin.CONVERTERS),
        "validators": dict(builtin.VALIDATORS),
    }
    for kind, group in (("converters", CONVERTER_GROUP), ("validators", VALIDATOR_GROUP)):
        for ep in entry_points(group=group):
            found[kind][ep.name] = ep  # loaded lazily: a broken plugin only hurts pipelines using it
    return found


def resolve(kind: str, name: str) -> type[Plugin]:
    entry = registry()[kind].get(name)
    if entry is None:
        known = ", ".join(sorted(registry()[kind]))
        raise LookupError(f"unknown {kind[:-1]} '{name}' (known: {known})")
    cls = entry if isinstance(entry, type) else entry.load()
    base = Converter if kind == "converters" else Validator
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{kind[:-1]} '{name}' is {cls!r}, not a subclass of {base.__module__}.{base.__name__}")
    return cls


@overload
def instantiate(kind: Literal["converters"], ref: PluginRef, target: dict[str, ColumnSpec]) -> Converter: ...
@overload
def instantiate(kind: Literal["validators"], ref: PluginRef, target: dict[str, ColumnSpec]) -> Validator: ...
def instantiate(kind: str, ref: PluginRef, target: dict[str, ColumnSpec]) -> Plugin:
    cls = resolve(kind, ref.plugin)
    return cls(ref.plugin, cls.Params.model_validate(ref.params), target)


def plugin_problems(config: PipelineConfig) -> list[tuple[str, str]]:
    """(key, problem) for every plugin entry that does not resolve or whose params are invalid."""
    problems = []
    for kind in ("converters", "validators"):
        for i, ref in enumerate(getattr(config, kind)):
            key = f"{kind}[{i}]"
            try:
                cls = resolve(kind, ref.plugin)
            except (LookupError, TypeError, ImportError, AttributeError) as exc:
                problems.append((f"{key}.plugin", str(exc)))
                continue
            try:
                params = cls.Params.model_validate(ref.params)
            except ValidationError as exc:
                for err in exc.errors():
                    where = ".".join(str(p) for p in err["loc"])
                    message = (
                        "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
                    )
                    problems.append((f"{key}.{where}" if where else key, message))
                continue
            check = getattr(cls, "check_config", None)
            if check:
                problems.extend((f"{key}.{k}" if k else key, p) for k, p in check(params, config))
    return problems
