"""Field-level resolution of an old profile against newer CDC changes: one function for every tenant.

Fields are schema-on-read JSON objects, different per tenant, so nothing here knows a schema. The rules:

1. Order. Changes apply in CDC sequence order, whatever order they arrived in. A change whose
   sequence is not above the stored row's is ignored (late or replayed): it never wins. So a late
   partial change still adds the keys no newer change sets while both are in one batch, but is
   dropped whole once the newer one is stored (the raw row keeps no per-field sequences).
2. Newer non-null wins. Top-level keys resolve independently: a key with a non-null value in a newer
   change replaces the older value; keys the newer change does not mention keep their value.
3. Null keeps. An explicit null in a newer change is "not captured", not "erase": the older value
   stays (CDC images of partial updates carry nulls for untouched columns). Merged objects never
   store null-valued keys. To clear a value, send an empty one ("", [], {}).
4. Arrays and nested objects are values. A newer non-null array replaces the old array whole (no
   union, no element merge; order and duplicates as sent), so [] clears a list. Nested objects are
   replaced whole too: a change states the full value of each top-level key it carries.
5. Deletes. op=delete removes the profile: the row becomes a tombstone (deleted, no fields, no
   links) carrying the delete's sequence, so an older change arriving later cannot resurrect it. A
   newer upsert re-creates the profile from empty fields: nothing from before the delete returns.
6. Other columns follow rule 2: `related_ids` (the record's graph neighbours; [] clears them) and
   `record_type` come from the newest change that carries them; `cdc_ts` from the newest change.

`merge_fields` / `resolve_changes` are the reference; tenant_merge.py applies the same rules to a
whole tenant's batch at once (in Spark's Python workers), tested against them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

UPSERT, DELETE = "upsert", "delete"


def merge_fields(old: dict[str, Any] | None, new: dict[str, Any] | None) -> dict[str, Any]:
    """`new` (the newer change's fields) over `old`: rules 2-4."""
    merged = {k: v for k, v in (old or {}).items() if v is not None}
    merged.update((k, v) for k, v in (new or {}).items() if v is not None)
    return merged


@dataclass(frozen=True)
class Change:
    seq: int
    op: str = UPSERT
    fields: dict[str, Any] | None = None
    related_ids: tuple[str, ...] | None = None
    record_type: str | None = None
    ts: Any = None


@dataclass(frozen=True)
class ProfileState:
    seq: int
    deleted: bool = False
    fields: dict[str, Any] | None = field(default=None)
    linked_ids: tuple[str, ...] = ()
    record_type: str | None = None
    ts: Any = None


def resolve_changes(stored: ProfileState | None, changes: Iterable[Change]) -> ProfileState | None:
    """The profile after applying `changes` (any order) to `stored`; None when none of them is newer."""
    floor = stored.seq if stored is not None else None
    fresh = sorted((c for c in changes if floor is None or c.seq > floor), key=lambda c: c.seq)
    if not fresh:
        return None
    state = stored
    for c in fresh:
        if c.op == DELETE:
            kind = c.record_type if c.record_type is not None else (state.record_type if state else None)
            state = ProfileState(c.seq, True, None, (), kind, c.ts)
            continue
        alive = state is not None and not state.deleted
        state = ProfileState(
            seq=c.seq,
            fields=merge_fields(state.fields if alive else None, c.fields),
            linked_ids=tuple(c.related_ids) if c.related_ids is not None else (state.linked_ids if alive else ()),
            record_type=c.record_type if c.record_type is not None else (state.record_type if state else None),
            ts=c.ts,
        )
    return state
