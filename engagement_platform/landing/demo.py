"""Demo landing files for pipelines/rewards_members.yaml (deterministic for a seed).

Store exports of loyalty members as CSV, with a small share of every kind of bad row: lines that do
not parse, values that do not convert, values that break a constraint.
"""

from __future__ import annotations

import random

from engagement_platform.landing.files import land

FIRST = ("Ann", "Bob", "Cy", "Dee", "Eve", "Finn", "Gia", "Hal", "Ida", "Jon", "Kai", "Lea")
LAST = ("Lee", "Stone", "Young", "Park", "Moss", "Diaz", "Khan", "Ito", "Berg", "Silva")
LEVELS = ("B", "S", "G", "bronze", "silver", "gold")
HEADER = "id,name,bday,level,email,points"


def member_line(rng: random.Random, member_id: int, bad: bool) -> str:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    bday = f"{rng.randint(1, 12):02d}/{rng.randint(1, 28):02d}/{rng.randint(1940, 2006)}"
    fields = [
        str(member_id),
        f"{first} {last}",
        bday,
        rng.choice(LEVELS),
        f"{first.lower()}.{last.lower()}@example.com",
        str(rng.randint(0, 50_000)),
    ]
    if bad:
        kind = rng.randrange(6)
        if kind == 0:
            return ",".join(fields[:4])  # parse: too few fields
        if kind == 1:
            fields[2] = "13/45/1990"  # convert: not a date
        elif kind == 2:
            fields[3] = "platinum"  # convert: no mapping
        elif kind == 3:
            fields[4] = ""  # validate: required
        elif kind == 4:
            fields[5] = "-5"  # validate: out of range
        else:
            fields[4], fields[5] = "not-an-email", "9999999"  # validate: two errors at once
    return ",".join(fields)


def write_members_file(
    folder: str,
    name: str,
    rows: int,
    seed: int,
    bad_ratio: float = 0.03,
    first_id: int = 1,
    storage_options: dict | None = None,
) -> str:
    """Land a members file (a local folder or an object-store prefix) under a dot-name, then move it in: the
    landing sensor never sees a half-written file."""
    rng = random.Random(seed)
    lines = [HEADER] + [member_line(rng, first_id + i, rng.random() < bad_ratio) for i in range(rows)]
    return land(str(folder), name, ("\n".join(lines) + "\n").encode(), storage_options)
