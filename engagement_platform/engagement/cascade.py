"""Exact cascade reduction of one org's batch of ID mutation requests (pure Python, no Spark).

Semantics (`apply_one_by_one`, the reference): apply the requests one at a time in the order of
(request_time, request_id). `reduce_requests` turns the batch into two small lookup tables that
one Delta MERGE applies row by row (`reduced_row` is that per-row function, `apply_reduction` the
MERGE in Python), with the same result as the reference on any table.

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

import gc
from bisect import bisect_left, bisect_right
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from functools import cached_property
from typing import Any, Iterable, Mapping, NamedTuple

OWNER_FIELDS = ("lead_id", "contact_id", "account_id", "user_id")
FIRST_DAY = date.min.toordinal()  # also the day of a null engagement_date
END_OF_TIME = date.max.toordinal() + 1
DELETE = "delete"
REPLACE = "replace"

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class MutationRequest:
    """One ID mutation request; use the op constructors below. Columns match the Spark input."""

    request_id: str
    org_id: str
    request_time: Any  # datetime or epoch micros: only compared
    op: str
    field: str | None = None  # convert: from_field; merge and owner delete: the owner field
    owner_id: str | None = None  # convert: from_id; owner delete: the id
    from_ids: tuple[str, ...] = ()  # merge
    to_field: str | None = None  # convert
    to_id: str | None = None  # convert, merge
    engagement_id: str | None = None  # update, delete by engagement
    record: Mapping[str, Any] | None = None  # update: every column but org_id, engagement_id
    date_from: date | None = None  # inclusive, None = open
    date_to: date | None = None

    @classmethod
    def convert(cls, request_id, org_id, request_time, from_field, from_id, to_field, to_id, **dates) -> MutationRequest:
        return cls(
            request_id, org_id, request_time, "convert", field=from_field, owner_id=from_id, to_field=to_field, to_id=to_id, **dates
        )

    @classmethod
    def merge(cls, request_id, org_id, request_time, field, from_ids, to_id, **dates) -> MutationRequest:
        return cls(request_id, org_id, request_time, "merge", field=field, from_ids=tuple(from_ids), to_id=to_id, **dates)

    @classmethod
    def delete_owner(cls, request_id, org_id, request_time, field, owner_id, **dates) -> MutationRequest:
        return cls(request_id, org_id, request_time, "delete", field=field, owner_id=owner_id, **dates)

    @classmethod
    def delete_engagement(cls, request_id, org_id, request_time, engagement_id, **dates) -> MutationRequest:
        return cls(request_id, org_id, request_time, "delete", engagement_id=engagement_id, **dates)

    @classmethod
    def update(cls, request_id, org_id, request_time, engagement_id, record, **dates) -> MutationRequest:
        return cls(request_id, org_id, request_time, "update", engagement_id=engagement_id, record=dict(record), **dates)

    @property
    def order(self) -> tuple:
        return (self.request_time, self.request_id)


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


# ---------------------------------------------------------------- the reference: one at a time


def day_key(day: date | None) -> int:
    return FIRST_DAY if day is None else day.toordinal()


def in_date_range(day: date | None, date_from: date | None, date_to: date | None) -> bool:
    key = day_key(day)
    return (date_from is None or key >= date_from.toordinal()) and (date_to is None or key <= date_to.toordinal())


def full_record(record: Mapping[str, Any]) -> Row:
    """A replacement record with every owner column and the date present (missing = null)."""
    out = {name: None for name in (*OWNER_FIELDS, "engagement_date")}
    out.update((k, v) for k, v in record.items() if k not in ("org_id", "engagement_id"))
    return out


def as_table(rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]) -> dict[str, Row]:
    """engagement_id -> row copy with every owner column and the date present."""
    values = rows.values() if isinstance(rows, Mapping) else rows
    table = {}
    for row in values:
        copy = dict(row)
        for name in (*OWNER_FIELDS, "engagement_date"):
            copy.setdefault(name, None)
        table[copy["engagement_id"]] = copy
    return table


def apply_one_by_one(rows, requests: Iterable[MutationRequest]) -> dict[str, Row]:
    """The slow, obviously correct semantics every reduction must reproduce."""
    table = as_table(rows)
    for request in sorted(requests, key=lambda r: r.order):
        _apply_request(table, request)
    return table


def _apply_request(table: dict[str, Row], request: MutationRequest) -> None:
    def hit(row: Row) -> bool:
        return in_date_range(row["engagement_date"], request.date_from, request.date_to)

    if request.op == "convert":
        for row in table.values():
            if row[request.field] == request.owner_id and hit(row):
                row[request.field] = None
                row[request.to_field] = request.to_id
    elif request.op == "merge":
        ids = set(request.from_ids)
        for row in table.values():
            if row[request.field] in ids and hit(row):
                row[request.field] = request.to_id
    elif request.op == "delete" and request.engagement_id is not None:
        row = table.get(request.engagement_id)
        if row is not None and hit(row):
            del table[request.engagement_id]
    elif request.op == "delete":
        for eid in [eid for eid, row in table.items() if row[request.field] == request.owner_id and hit(row)]:
            del table[eid]
    elif request.op == "update":
        row = table.get(request.engagement_id)
        if row is not None and hit(row):
            keys = {"org_id": row["org_id"], "engagement_id": row["engagement_id"]}
            table[request.engagement_id] = {**keys, **full_record(request.record)}


# ---------------------------------------------------------------- applying a reduction (the MERGE)


def settle_owners(owners: Mapping[str, str | None], fates: Mapping[str, OwnerFate]) -> tuple[int | None, dict[str, str | None]]:
    """(seq that deletes the row or None, final owner columns) of a row whose owner ids have these fates.

    Fields without a fate keep their id unless another id moves into the field, which erases it
    (and with it any later fate of the erased id, which is why the moves are replayed in order).
    """
    if not any(fate.moves for fate in fates.values()):
        deletes = [fate.deleted_at for fate in fates.values() if fate.deleted_at is not None]
        if deletes:
            return min(deletes), {}
        return None, {name: fate.new_id for name, fate in fates.items()}
    current = {name: name for name in OWNER_FIELDS if owners.get(name) is not None}  # token -> field
    occupant = {name: name for name in current}  # field -> token
    events = []
    for name, fate in fates.items():
        events.extend((seq, name, to_field) for seq, to_field in fate.moves)
        if fate.deleted_at is not None:
            events.append((fate.deleted_at, name, None))
    for seq, token, to_field in sorted(events):
        if token not in current:
            continue  # erased earlier by another id moving into its field
        if to_field is None:
            return seq, {}
        del occupant[current[token]]
        erased = occupant.get(to_field)
        if erased is not None:
            del current[erased]
        occupant[to_field] = token
        current[token] = to_field
    final = dict.fromkeys(OWNER_FIELDS)
    for token in current:
        fate = fates.get(token)
        final[fate.new_field if fate else token] = fate.new_id if fate else owners[token]
    return None, final


def reduced_row(row: Row, reduction: Reduction) -> Row | None:
    """What the MERGE does to one row: a function of its own columns and the reduction's lookups."""
    day = day_key(row["engagement_date"])
    fates = {}
    for name in OWNER_FIELDS:
        value = row.get(name)
        if value is not None:
            fate = reduction.owner_fate(name, value, day)
            if fate is not None:
                fates[name] = fate
    deleted_at, owners = settle_owners(row, fates) if fates else (None, {})
    for branch in reduction.branches(row["engagement_id"]):
        if day_key(branch.date_from) <= day and (branch.date_to is None or day <= branch.date_to.toordinal()):
            if deleted_at is None or branch.seq < deleted_at:
                if branch.action == DELETE:
                    return None
                return {"org_id": row["org_id"], "engagement_id": row["engagement_id"], **branch.record}
            break  # later branches come after the row's delete too
    if deleted_at is not None:
        return None
    return {**row, **owners} if owners else row


def apply_reduction(rows, reduction: Reduction) -> dict[str, Row]:
    """Apply a Reduction in one pass, each row independently, as the Delta MERGE will."""
    out = {}
    for eid, row in as_table(rows).items():
        new_row = reduced_row(row, reduction)
        if new_row is not None:
            out[eid] = new_row
    return out


# ---------------------------------------------------------------- the fold

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
                    resident = target_slot.cells[j] = _Node(target[0], target[1], target_slot.starts[j], target_slot.end(j))
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
    with _no_cyclic_gc():
        fold = _CascadeFold()
        for seq, request in enumerate(ordered):
            fold.apply(seq, request)
        return fold.reduction(tuple(r.request_id for r in ordered))


@contextmanager
def _no_cyclic_gc():
    """The fold allocates many small acyclic objects; the cycle collector scanning them took ~40% of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
