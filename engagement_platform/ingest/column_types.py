"""Column types a pipeline may declare, and the load-time checks of values given for them (bounds,
date formats): Spark would otherwise fail a whole batch on them at run time."""

from __future__ import annotations

import re
from datetime import date, datetime

TYPE = re.compile(r"^(string|boolean|int|integer|long|bigint|short|double|float|date|timestamp|decimal\(\d+,\s*\d+\))$")
NUMERIC_OR_TEMPORAL = re.compile(r"^(int|integer|long|bigint|short|double|float|date|timestamp|decimal.*)$")

DATETIME_LETTERS = set("GyDMLdQqEFahKkHmsSVzOXxZ")  # Spark datetime pattern letters (no week-based ones)


def check_formats(formats: list[str] | None) -> list[str] | None:
    """Spark fails the whole batch on a pattern letter it does not know: say so at load time."""
    for fmt in formats or []:
        unquoted = re.sub(r"'[^']*'", "", fmt)
        bad = sorted({c for c in unquoted if c.isascii() and c.isalpha() and c not in DATETIME_LETTERS})
        if bad:
            raise ValueError(
                f"format '{fmt}' has letters that are not Spark datetime pattern letters: {', '.join(bad)} "
                "(quote literal text, e.g. 'T')"
            )
    return formats


def bound_problem(type_: str, value: float | str | None) -> str | None:
    """Why a min/max bound cannot be compared with a column of this type (None when it can):
    Spark would fail the whole batch on it (a date against a number, a number against text)."""
    if value is None or not NUMERIC_OR_TEMPORAL.match(type_):
        return None
    if type_ in ("date", "timestamp"):
        try:
            (date if type_ == "date" else datetime).fromisoformat(value if isinstance(value, str) else "?")
        except ValueError:
            return f'{value!r} is not an ISO {type_} (e.g. "1900-01-01")'
        return None
    return f"{value!r} is not a number" if isinstance(value, str) else None
