"""Subexpressions a vectorized plan computes once per row.

DuckDB does not share a repeated subexpression between a step's outputs and its checks (a conversion used
by the converted column and by its wrong_type check, a regex's captured parts read four times): each copy is
evaluated again. A builder wraps such a subexpression in `once(...)`; `hoist` then gives every distinct one a
hidden column, computed in projections before the step (innermost first), and the step reads the column.
A hoisted expression runs on every row, so it must never raise (TRY_CAST, regexp functions, arithmetic on
nulls): a CASE around it no longer guards it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

OPEN, CLOSE = "\x02", "\x03"  # cannot occur in SQL the builders write: literals are escaped text of configs
INNERMOST = re.compile(f"{OPEN}([^{OPEN}{CLOSE}]*){CLOSE}")


def once(expr: str) -> str:
    """`expr`, marked to be computed once per row however often the step's SQL repeats it."""
    return f"{OPEN}{expr}{CLOSE}"


@dataclass
class Hoisted:
    levels: list[dict[str, str]]  # hidden column -> SQL, in the order they must be computed
    texts: list[str]  # the input texts with each marked subexpression replaced by its column

    def hidden(self) -> Iterator[str]:
        for level in self.levels:
            yield from level


def hoist(texts: list[str], quote: Callable[[str], str], prefix: str) -> Hoisted:
    """Every marked subexpression of `texts` as a hidden column named `prefix` + a number (`quote` makes the
    column reference); the same text, wherever it occurs, is one column."""
    by_text: dict[str, str] = {}
    levels: list[dict[str, str]] = []
    while any(OPEN in t for t in texts):
        level: dict[str, str] = {}

        def column(match: re.Match) -> str:
            text = match.group(1)
            if text not in by_text:
                by_text[text] = f"{prefix}{len(by_text) + 1}"
                level[by_text[text]] = text
            return quote(by_text[text])

        texts = [INNERMOST.sub(column, t) for t in texts]
        levels.append(level)
    return Hoisted(levels, texts)
