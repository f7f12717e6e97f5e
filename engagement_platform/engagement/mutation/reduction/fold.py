"""Exact cascade reduction of one org's batch of ID mutation requests (pure Python, no Spark).
Long by design: the fold is one algorithm, and the proof below and the node, slot and fold classes
that implement it are read together.

Semantics (`reference.apply_one_by_one`): apply the requests one at a time in the order of
(request_time, request_id). `reduce_requests` turns the batch into two small lookup tables
(model.Reduction) that one Delta MERGE applies row by row (`row_outcome.reduced_row` is that
per-row function, `outcome_table` the same computed column-wise for the stream), with the same
result as the reference on any table.

The representation.
- Owner actions, keyed by (field, id, date piece): an OwnerFate = the id's final (field, id), or
  the seq of the request that deletes rows holding it, plus its cross-field moves (seq, to_field).
- Engagement actions, keyed by engagement_id: branches (seq, date range, delete | replace(record))
  in seq order, the record being final (later renames of its ids already applied).
A row looks up each of its owner ids at its engagement_date, `settle_owners` combines them into
its new owner columns or the seq at which it is deleted, then it takes the first branch of its
engagement_id whose range holds its date, if that branch's seq precedes its owner delete.

Why this is exact.
1. Think of each owner value in a row as a token at a position (field, id). Every request acts on
   positions, never on anything else in the row: rows holding the same position on the same date
   behave identically from then on. So the fold keeps one node per (position, date piece) and
   moves it as a whole; when it lands on an occupied position it is pointed at the resident, union-
   find style. Resolving the nodes (memoized along the chains) gives every original id's fate:
   chains 1->2->3 collapse to one hop per id, a rename and its revert resolve to the identity and
   are dropped, an id deleted earlier is an empty position that a later rename leaves alone.
2. Fields interact only through a convert (f, a) -> (g, b): it overwrites field g, erasing the
   token that was there, whose later requests must then not touch the row. A token's own future
   does not depend on the others, so replaying the at most four tokens' moves in seq order and
   dropping a token when another moves into its field is exact. Without moves (the common case)
   this is a plain per-column rewrite, and the row is deleted at the first delete among its ids.
3. Date ranges: a row's date only changes through an update, so until then a ranged request hits
   a row iff the row's own date is in range. Each position's date axis is split at the bounds of
   the ranged requests that touch it (the elementary intervals, only where they matter) and each
   piece gets its own node; adjacent pieces with equal fates are merged again in the output. A
   null engagement_date counts as 0001-01-01.
4. After an update the row is a known record: its ids join the fold at the update's seq and at
   the record's date, so its future (later renames, deletes, updates of the same engagement) is
   resolved in advance and a branch's outcome does not depend on the row. Update and delete by
   engagement_id hit the row iff its date is in range and it still exists, i.e. no owner delete
   came first; the first branch whose range holds the date decides, as later ones come later.

Cost: sorting plus O(1) dict work per request and per date piece touched; resolution is linear
in the nodes. No request is compared with another, so the fold is O(n log n).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from datetime import date
from typing import NamedTuple

from engagement_platform.engagement.mutation.reduction.model import (
    EngagementAction,
    ExternalTarget,
    OwnerAction,
    OwnerFate,
    Reduction,
    ReductionStats,
)
from engagement_platform.engagement.mutation.reduction.row_outcome import settle_owners
from engagement_platform.engagement.mutation.requests import (
    DELETE,
    END_OF_TIME,
    FIRST_DAY,
    OWNER_FIELDS,
    REPLACE,
    MutationRequest,
    Row,
    day_key,
    full_record,
)
from engagement_platform.streams.gc_pause import no_cyclic_gc

UNTOUCHED = "untouched"  # slot cell: the position's original rows sit there, no request touched them
EMPTY = None  # slot cell: nobody holds this id on these dates any more (moved away or deleted)


class _Node:
    """Rows holding one position on one date piece from some request on: they share one future."""

    __slots__ = ("field", "id", "lo", "hi", "deleted_at", "seq", "move_to", "targets", "fates")

    def __init__(self, field: str, owner_id: str, lo: int, hi: int):
        self.field, self.id, self.lo, self.hi = field, owner_id, lo, hi
        self.deleted_at = None
        self.seq = None  # when the node ended by moving (or splitting: then move_to stays None)
        self.move_to = None  # the new field if that move crossed fields
        self.targets = None  # nodes tiling [lo, hi) in date order that carry the future on
        self.fates = None  # resolved: [(lo, hi, OwnerFate)]

    def resolved(self) -> list:
        """[(lo, hi, OwnerFate)]: set by the fold's resolution for ended nodes, computed here for the rest."""
        if self.fates is None:
            assert self.targets is None, "an ended node is resolved before the nodes that point at it"
            if self.deleted_at is not None:
                fate = OwnerFate(self.deleted_at, None, None, ())
            else:
                fate = OwnerFate(None, self.field, self.id, ())
            self.fates = [(self.lo, self.hi, fate)]
        return self.fates

    def fate_at(self, day: int) -> OwnerFate:
        fates = self.resolved()
        if len(fates) == 1:
            return fates[0][2]
        return fates[bisect_right([lo for lo, _, _ in fates], day) - 1][2]


class _Slot:
    """One position's date axis: pieces [starts[i], starts[i+1]) each with a cell (node, UNTOUCHED, EMPTY)."""

    __slots__ = ("starts", "cells")

    def __init__(self):
        self.starts = [FIRST_DAY]
        self.cells: list = [UNTOUCHED]

    def end(self, i: int) -> int:
        return self.starts[i + 1] if i + 1 < len(self.starts) else END_OF_TIME


class _EngagementEvent(NamedTuple):
    seq: int
    lo: int
    hi: int
    record: Row | None  # None = delete by engagement_id
    day: int  # the record's engagement_date
    tokens: tuple  # ((position, node the record's id joined or None = the position's original rows), ...)


def _extend_merged(pieces: list, more: Iterable) -> None:
    for lo, hi, fate in more:
        if pieces and pieces[-1][1] == lo and pieces[-1][2] == fate:
            pieces[-1] = (pieces[-1][0], hi, fate)
        else:
            pieces.append((lo, hi, fate))


def _day(key: int, upper: bool) -> date | None:
    if upper:
        return None if key >= END_OF_TIME else date.fromordinal(key - 1)
    return None if key <= FIRST_DAY else date.fromordinal(key)


_WELL_FORMED = {
    "convert": lambda r: r.field in OWNER_FIELDS and r.to_field in OWNER_FIELDS and r.owner_id and r.to_id,
    "merge": lambda r: r.field in OWNER_FIELDS and r.from_ids and r.to_id,
    "delete": lambda r: r.engagement_id or (r.field in OWNER_FIELDS and r.owner_id),
    "update": lambda r: r.engagement_id and r.record is not None,
}


def _validate(request: MutationRequest) -> None:
    """Malformed requests belong in quarantine upstream; here they are a bug, so fail loudly."""
    well_formed = _WELL_FORMED.get(request.op)
    if well_formed is None or not well_formed(request):
        raise ValueError(f"invalid mutation request {request.request_id!r}: {request}")


class _CascadeFold:
    """Folds ordered requests into nodes; `reduction()` resolves them into lookup tables."""

    def __init__(self):
        self.slots: dict[tuple[str, str], _Slot] = {}
        self.origins: dict[tuple[str, str], list[_Node]] = {}  # nodes of the rows an id held before the batch
        self.ended: list[_Node] = []  # in order of ending: a node's targets end later or never
        self.produced: set[tuple[str, str]] = set()
        self.external: list[ExternalTarget] = []
        self.engagement_events: dict[str, list[_EngagementEvent]] = {}

    # -- one request

    def apply(self, seq: int, request: MutationRequest) -> None:
        _validate(request)
        lo = FIRST_DAY if request.date_from is None else request.date_from.toordinal()
        hi = END_OF_TIME if request.date_to is None else request.date_to.toordinal() + 1
        if lo >= hi:
            return  # an empty date range matches no row
        if request.op == "convert":
            source, target = (request.field, request.owner_id), (request.to_field, request.to_id)
            self._need_owner(request, source)
            if source != target:
                self._move(seq, source, lo, hi, target)
            self.produced.add(target)
        elif request.op == "merge":
            target = (request.field, request.to_id)
            for from_id in dict.fromkeys(request.from_ids):
                if from_id != request.to_id:
                    self._need_owner(request, (request.field, from_id))
                    self._move(seq, (request.field, from_id), lo, hi, target)
            self.produced.add(target)
        elif request.op == "delete" and request.engagement_id is None:
            self._need_owner(request, (request.field, request.owner_id))
            self._delete(seq, (request.field, request.owner_id), lo, hi)
        else:
            self.external.append(ExternalTarget(request.request_id, "engagement", None, request.engagement_id))
            record, day, tokens = None, FIRST_DAY, ()
            if request.op == "update":
                record = full_record(request.record)
                day = day_key(record["engagement_date"])
                positions = [(name, record[name]) for name in OWNER_FIELDS if record[name] is not None]
                tokens = tuple((position, self._resident(position, day)) for position in positions)
                self.produced.update(positions)
            event = _EngagementEvent(seq, lo, hi, record, day, tokens)
            self.engagement_events.setdefault(request.engagement_id, []).append(event)

    def _need_owner(self, request: MutationRequest, position: tuple[str, str]) -> None:
        if position not in self.produced:
            self.external.append(ExternalTarget(request.request_id, "owner", position[0], position[1]))

    def _slot(self, position: tuple[str, str]) -> _Slot:
        slot = self.slots.get(position)
        if slot is None:
            slot = self.slots[position] = _Slot()
        return slot

    def _cut(self, slot: _Slot, key: int) -> None:
        """Make `key` a piece boundary; a node on the split piece ends in one node per side."""
        if key <= FIRST_DAY or key >= END_OF_TIME:
            return
        i = bisect_right(slot.starts, key) - 1
        if slot.starts[i] == key:
            return
        cell = slot.cells[i]
        if isinstance(cell, _Node):
            left, right = _Node(cell.field, cell.id, cell.lo, key), _Node(cell.field, cell.id, key, cell.hi)
            self._end(cell, None, None, [left, right])
            slot.cells[i], cell = left, right
        slot.starts.insert(i + 1, key)
        slot.cells.insert(i + 1, cell)

    def _pieces(self, slot: _Slot, lo: int, hi: int) -> range:
        if lo == FIRST_DAY and hi == END_OF_TIME:  # unranged: every piece, nothing to cut
            return range(len(slot.starts))
        self._cut(slot, lo)
        self._cut(slot, hi)
        return range(bisect_left(slot.starts, lo), bisect_left(slot.starts, hi))

    def _occupant(self, position: tuple[str, str], slot: _Slot, i: int) -> _Node | None:
        cell = slot.cells[i]
        if cell is UNTOUCHED:  # first touch: the original rows become a node
            cell = slot.cells[i] = _Node(position[0], position[1], slot.starts[i], slot.end(i))
            self.origins.setdefault(position, []).append(cell)
        return cell

    def _resident(self, position: tuple[str, str], day: int) -> _Node | None:
        """The node an update's id joins at `day`: the one there, a new one if the place is empty, or
        None while no request touched the place: the id then shares the original rows' fate."""
        slot = self.slots.get(position)
        if slot is None:
            return None
        i = bisect_right(slot.starts, day) - 1
        node = slot.cells[i]
        if node is UNTOUCHED:
            return None
        if node is EMPTY:
            node = slot.cells[i] = _Node(position[0], position[1], slot.starts[i], slot.end(i))
        return node

    def _origin_fate(self, position: tuple[str, str], day: int) -> OwnerFate | None:
        for origin in self.origins.get(position, ()):
            if origin.lo <= day < origin.hi:
                return origin.fate_at(day)
        return None  # never touched

    def _end(self, node: _Node, seq: int | None, move_to: str | None, targets: list[_Node]) -> None:
        node.seq, node.move_to, node.targets = seq, move_to, targets
        self.ended.append(node)

    def _move(self, seq: int, source: tuple[str, str], lo: int, hi: int, target: tuple[str, str]) -> None:
        slot = self._slot(source)
        move_to = target[0] if target[0] != source[0] else None
        for i in self._pieces(slot, lo, hi):
            node = self._occupant(source, slot, i)
            if node is None:
                continue  # already moved away or deleted on these dates: nothing to do
            slot.cells[i] = EMPTY
            target_slot = self._slot(target)
            residents = []
            for j in self._pieces(target_slot, node.lo, node.hi):
                resident = self._occupant(target, target_slot, j)
                if resident is None:
                    resident = target_slot.cells[j] = _Node(
                        target[0], target[1], target_slot.starts[j], target_slot.end(j)
                    )
                residents.append(resident)
            self._end(node, seq, move_to, residents)

    def _delete(self, seq: int, position: tuple[str, str], lo: int, hi: int) -> None:
        slot = self._slot(position)
        for i in self._pieces(slot, lo, hi):
            node = self._occupant(position, slot, i)
            if node is not None:
                node.deleted_at = seq
                slot.cells[i] = EMPTY

    # -- resolution

    def _resolve(self) -> None:
        for node in reversed(self.ended):
            pieces: list = []
            for target in node.targets:
                fates = target.resolved()
                if node.move_to is not None:
                    step = ((node.seq, node.move_to),)
                    fates = [(lo, hi, fate._replace(moves=step + fate.moves)) for lo, hi, fate in fates]
                _extend_merged(pieces, fates)
            node.fates = pieces

    def _owner_actions(self) -> list[OwnerAction]:
        actions = []
        for (name, owner_id), origins in self.origins.items():
            if len(origins) == 1:
                pieces = origins[0].resolved()
            else:  # pieces of the date axis first touched by different requests
                pieces = []
                _extend_merged(pieces, sorted(piece for origin in origins for piece in origin.resolved()))
            for lo, hi, fate in pieces:
                if fate.moves or fate.deleted_at is not None or fate.new_id != owner_id or fate.new_field != name:
                    actions.append(OwnerAction(name, owner_id, _day(lo, False), _day(hi, True), fate))
        return actions

    def _engagement_actions(self) -> list[EngagementAction]:
        actions = []
        for engagement_id, events in self.engagement_events.items():
            covered: list[tuple[int, int]] = []  # date ranges of earlier branches, merged
            for event, (action, record) in zip(events, self._event_outcomes(events)):
                if len(events) > 1:
                    if _covers(covered, event.lo, event.hi):
                        continue  # a row in this range took an earlier branch or was deleted before it
                    _add_range(covered, event.lo, event.hi)
                date_from, date_to = _day(event.lo, False), _day(event.hi, True)
                actions.append(EngagementAction(engagement_id, event.seq, date_from, date_to, action, record))
        return actions

    def _event_outcomes(self, events: list[_EngagementEvent]) -> list[tuple[str, Row | None]]:
        """Outcome of each event for a row it applies to; computed backwards so later events are known."""
        outcomes: list = [None] * len(events)
        for k in range(len(events) - 1, -1, -1):
            event = events[k]
            if event.record is None:
                outcomes[k] = (DELETE, None)
                continue
            fates = {}
            for position, node in event.tokens:
                fate = self._origin_fate(position, event.day) if node is None else node.fate_at(event.day)
                if fate is not None:
                    fates[position[0]] = fate
            deleted_at, owners = settle_owners(event.record, fates)
            outcome = None
            for j in range(k + 1, len(events)):
                later = events[j]
                if deleted_at is not None and later.seq > deleted_at:
                    break
                if later.lo <= event.day < later.hi:
                    outcome = outcomes[j]
                    break
            if outcome is None:
                outcome = (DELETE, None) if deleted_at is not None else (REPLACE, {**event.record, **owners})
            outcomes[k] = outcome
        return outcomes

    def reduction(self, request_ids: tuple[str, ...]) -> Reduction:
        self._resolve()
        owner_actions = self._owner_actions()
        engagement_actions = self._engagement_actions()
        stats = ReductionStats(len(request_ids), len(owner_actions), len(engagement_actions))
        return Reduction(tuple(owner_actions), tuple(engagement_actions), tuple(self.external), request_ids, stats)


def _covers(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(a <= lo and hi <= b for a, b in ranges)


def _add_range(ranges: list[tuple[int, int]], lo: int, hi: int) -> None:
    """Insert [lo, hi) and merge touching ranges, so _covers sees their union."""
    kept = []
    for a, b in ranges:
        if b < lo or a > hi:
            kept.append((a, b))
        else:
            lo, hi = min(a, lo), max(b, hi)
    kept.append((lo, hi))
    ranges[:] = sorted(kept)


def reduce_requests(requests: Iterable[MutationRequest]) -> Reduction:
    """Reduce one org's batch to the Reduction that gives apply_one_by_one's result on any table."""
    ordered = sorted(requests, key=lambda r: r.order)
    if len({r.org_id for r in ordered}) > 1:
        raise ValueError("reduce_requests reduces one org's batch; group the requests by org_id first")
    with no_cyclic_gc():
        fold = _CascadeFold()
        for seq, request in enumerate(ordered):
            fold.apply(seq, request)
        return fold.reduction(tuple(r.request_id for r in ordered))


def external_targets(requests: Iterable[MutationRequest]) -> list[ExternalTarget]:
    """reduce_requests(requests).external_targets without the fold: which ids and engagements the batch
    needs from the table. Only the set of produced positions matters (the fold's rule, dates aside),
    so this scan costs a fraction of the fold and lets the stream find requests to hold back first."""
    produced: set[tuple[str, str]] = set()
    out: list[ExternalTarget] = []

    def need(request: MutationRequest, position: tuple[str, str]) -> None:
        if position not in produced:
            out.append(ExternalTarget(request.request_id, "owner", position[0], position[1]))

    for request in sorted(requests, key=lambda r: r.order):
        if request.date_from is not None and request.date_to is not None and request.date_from > request.date_to:
            continue  # an empty date range matches no row (the fold skips it too)
        if request.op == "convert":
            need(request, (request.field, request.owner_id))
            produced.add((request.to_field, request.to_id))
        elif request.op == "merge":
            for from_id in dict.fromkeys(request.from_ids):
                if from_id != request.to_id:
                    need(request, (request.field, from_id))
            produced.add((request.field, request.to_id))
        elif request.op == "delete" and request.engagement_id is None:
            need(request, (request.field, request.owner_id))
        else:
            out.append(ExternalTarget(request.request_id, "engagement", None, request.engagement_id))
            if request.op == "update":
                record = full_record(request.record)
                produced.update((name, record[name]) for name in OWNER_FIELDS if record[name] is not None)
    return out
