"""What the MERGE does to one row given a Reduction, in plain Python: the per-row definition that
`outcome_table` computes column-wise, and `apply_reduction`, which tests compare with the reference."""

from __future__ import annotations

from collections.abc import Mapping

from engagement_platform.engagement.mutation.reduction.model import OwnerFate, Reduction
from engagement_platform.engagement.mutation.requests import DELETE, OWNER_FIELDS, Row, as_table, day_key


def settle_owners(
    owners: Mapping[str, str | None], fates: Mapping[str, OwnerFate]
) -> tuple[int | None, dict[str, str | None]]:
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
