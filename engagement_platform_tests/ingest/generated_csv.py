"""Generated CSV lines for the record-format property tests (test_vector_plan_csv.py): a pipeline's source
columns as one line, each field plain or quoted (always quoted when its text holds the separator or the quote),
and the ways a line breaks (a field missing or extra, a stray or unclosed quote, text after a closing quote,
cut short, not UTF-8, empty, too large, noise)."""

from __future__ import annotations

from hypothesis import strategies as st

from engagement_platform_tests.ingest.generated_records import ABSENT_IF_OPTIONAL, NOISE, NOT_UTF8, RecordShape

QUOTE_ANYWAY = st.sampled_from([True, False, False, False])
EMPTY_WAYS = st.sampled_from(["plain", "plain", "quoted"])  # null, or the empty text
BREAKS = st.sampled_from(
    ["fewer", "more", "stray_quote", "unclosed", "after_quote", "truncate", "utf8", "empty", "oversized", "bytes"]
)
OVER_BY = st.integers(0, 20)


def field(text: str, sep: str, quote: str, quoted: bool) -> str:
    if quoted or sep in text or quote in text:
        return quote + text.replace(quote, quote * 2) + quote
    return text


@st.composite
def csv_records(draw: st.DrawFn, shape: RecordShape, sep: str = ",", quote: str = '"') -> bytes:
    """One line: every column's text valid except a few at an edge; an optional column sometimes empty."""
    broken = draw(shape.broken)
    fields = []
    for name, column in shape.columns.items():
        if name not in broken and column.optional and draw(ABSENT_IF_OPTIONAL):
            fields.append(field("", sep, quote, draw(EMPTY_WAYS) == "quoted"))
            continue
        text = draw(column.edges if name in broken else column.valid)
        fields.append(field(text, sep, quote, draw(QUOTE_ANYWAY)))
    return sep.join(fields).encode()


@st.composite
def broken_line(draw: st.DrawFn, good: bytes, limit: int, sep: str, quote: str) -> bytes | None:
    """A line that mostly does not parse (whether it does is the reference's call, not this generator's)."""
    kind = draw(BREAKS)
    s, q = sep.encode(), quote.encode()
    at = draw(st.integers(0, len(good)))
    if kind == "fewer":
        return good.rsplit(s, 1)[0]
    if kind == "more":
        return good + s + draw(st.sampled_from([b"", b"x", q + q]))
    if kind == "stray_quote":
        return good[:at] + q + good[at:]
    if kind == "unclosed":
        return q + good
    if kind == "after_quote":
        return q + b"a" + q + b"b" + s + good
    if kind == "truncate":
        return good[:at]
    if kind == "utf8":
        return good[:at] + draw(NOT_UTF8) + good[at:]
    if kind == "oversized":
        return good + b"x" * (max(limit - len(good), 0) + draw(OVER_BY))
    return draw(st.sampled_from([b"", None]) if kind == "empty" else NOISE)


BATCH_SIZE = st.integers(1, 16)
CORRUPT = st.sampled_from([True, False, False, False, False])


@st.composite
def csv_batches(draw: st.DrawFn, shape: RecordShape, limit: int, sep: str = ",", quote: str = '"') -> list:
    records = []
    for _ in range(draw(BATCH_SIZE)):
        good = draw(csv_records(shape, sep, quote))
        records.append(draw(broken_line(good, limit, sep, quote)) if draw(CORRUPT) else good)
    return records
