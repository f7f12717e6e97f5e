"""What the platform knows of a stream, in one object: each stream package's `stream.py` exports its
`DEFINITION`, and registry.py lists them. The Definitions (definitions.py), the `run-batch` command and
the lineage of the tables several streams write are built from that list, so adding a stream is its
package and one line there.

No Dagster here: `parts` is a function that imports the package's Dagster modules only when the
Definitions are assembled, so `run-batch` (a process per batch in the crash tests) never loads them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from engagement_platform.lake.delta import TableSpec
from engagement_platform.streams.by_hand import BatchAdapter
from engagement_platform.streams.spec import StreamSpec

MEMBER = "/<"  # "profile_processor/<tenant>": a family, one stream per member


@dataclass(frozen=True)
class StreamDefinition:
    """One stream, or one family of streams that share their Dagster parts (a stream per tenant)."""

    name: str  # run-batch's name: "mutation"; a family's: "profile_processor/<tenant>"
    parts: Callable[[], Any]  # -> its Dagster definitions: an orchestration Parts, or a KafkaStream
    spec: StreamSpec | None = None  # its checkpoint stream, txn app id and lock; None: a family (one per member)
    run_batch: BatchAdapter | None = None  # how run-batch runs one of its batches (streams/by_hand.py); None: never
    settings_section: str | None = None  # the Settings section it reads (settings.<section>); None: none of its own
    tables: tuple[TableSpec, ...] = ()  # Delta tables its batches commit (not the checkpoint store, nor one per member)
    asset: str | None = None  # the asset whose runs commit `tables`; None: a Kafka stream's stream asset
    aliases: tuple[str, ...] = ()  # other names run-batch takes (a landing pipeline's checkpoint stream)

    @property
    def family(self) -> str | None:
        """The family's name ("profile_processor" for "profile_processor/<tenant>"); None: a stream of its own."""
        return self.name.split(MEMBER, 1)[0] if MEMBER in self.name else None

    def member(self, stream: str) -> str | None:
        """What `stream` names of this definition: "" (the stream itself), a family's member, or None (another)."""
        if self.family is None:
            return "" if stream == self.name or stream in self.aliases else None
        family, _, member = stream.partition("/")
        return member if family == self.family and member else None


@dataclass(frozen=True)
class StreamFamily:
    """Streams the configuration says exist, each with Dagster parts of its own (a landing pipeline per
    YAML file): a StreamDefinition per member, read when the registry is expanded."""

    name: str  # how the list of streams names them: "ingest/<pipeline>"
    members: Callable[[], Sequence[StreamDefinition]]


RegistryEntry = StreamDefinition | StreamFamily


def expand(entries: Iterable[RegistryEntry]) -> list[StreamDefinition]:
    """Every stream of the entries, each family's members read now."""
    return [d for entry in entries for d in (entry.members() if isinstance(entry, StreamFamily) else [entry])]
