"""What a cascade reduction outputs: per-(owner id, date piece) fates and per-engagement branches,
with the lookups a MERGE row needs (`Reduction.owner_fate`, `Reduction.branches`)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from functools import cached_property
from typing import Any, NamedTuple

from engagement_platform.engagement.mutation.requests import DELETE, END_OF_TIME, day_key


class OwnerFate(NamedTuple):
    """Where the rows holding one id end up: final (field, id), or the seq of the delete that hits them."""

    deleted_at: int | None
    new_field: str | None
    new_id: str | None
    moves: tuple[tuple[int, str], ...]  # cross-field moves (seq, to_field), before any delete


class OwnerAction(NamedTuple):
    """Rows with row[field] == id and engagement_date in [date_from, date_to] (None = open)."""

    field: str
    id: str
    date_from: date | None
    date_to: date | None
    fate: OwnerFate

    @property
    def action(self) -> str:
        return DELETE if self.fate.deleted_at is not None else "rewrite"


class EngagementAction(NamedTuple):
    """Branch of one engagement: taken by its row if the date fits and seq precedes the row's owner delete."""

    engagement_id: str
    seq: int
    date_from: date | None
    date_to: date | None
    action: str  # DELETE or REPLACE
    record: Mapping[str, Any] | None  # REPLACE: the final record (owner ids already mapped)


class ExternalTarget(NamedTuple):
    """An id or engagement a request needs that no earlier request of the batch produced."""

    request_id: str
    kind: str  # "owner" or "engagement"
    field: str | None
    id: str


@dataclass(frozen=True, slots=True)
class ReductionStats:
    requests_in: int
    owner_actions: int
    engagement_actions: int

    @property
    def actions_out(self) -> int:
        return self.owner_actions + self.engagement_actions

    @property
    def reduction_ratio(self) -> float:
        """Requests per output action (higher = more reduced); requests_in when nothing is left."""
        return self.requests_in / max(self.actions_out, 1)


@dataclass(frozen=True)
class Reduction:
    owner_actions: tuple[OwnerAction, ...]
    engagement_actions: tuple[EngagementAction, ...]
    external_targets: tuple[ExternalTarget, ...]
    request_ids: tuple[str, ...]  # request_ids[seq]: which request a seq in the actions is
    stats: ReductionStats

    @cached_property
    def _owner_index(self) -> dict[tuple[str, str], tuple[list[int], list[int], list[OwnerFate]]]:
        index: dict = {}
        for action in self.owner_actions:  # one id's pieces come in date order
            los, his, fates = index.setdefault((action.field, action.id), ([], [], []))
            los.append(day_key(action.date_from))
            his.append(END_OF_TIME if action.date_to is None else action.date_to.toordinal() + 1)
            fates.append(action.fate)
        return index

    @cached_property
    def _engagement_index(self) -> dict[str, list[EngagementAction]]:
        index: dict = {}
        for action in self.engagement_actions:  # emitted in seq order per engagement
            index.setdefault(action.engagement_id, []).append(action)
        return index

    def owner_fate(self, field: str, owner_id: str, day: int) -> OwnerFate | None:
        entry = self._owner_index.get((field, owner_id))
        if entry is None:
            return None
        los, his, fates = entry
        i = bisect_right(los, day) - 1
        return fates[i] if i >= 0 and day < his[i] else None

    def branches(self, engagement_id: str) -> list[EngagementAction]:
        return self._engagement_index.get(engagement_id, [])
