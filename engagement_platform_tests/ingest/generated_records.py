"""Generated JSON records for the record-format property tests (test_vector_plan.py): values that each type
rule accepts and values at its edges, JSON tokens written every way JSON allows (escapes, spacing, trailing
commas, NaN, repeated keys), records built from a pipeline's source columns, and the ways a record breaks
(cut short, not an object, not UTF-8, empty, too large, junk around it).

Every strategy is built once, at import: one built inside a draw would be validated again on every draw."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime

from hypothesis import strategies as st

# ---- values: valid ones, and each type rule's edges ------------------------------------------------------

SPACES = st.sampled_from(["", "", "", " ", "  "])
BOOLEANS = st.booleans()


def one_time_in(n: int, rare: st.SearchStrategy, usual: st.SearchStrategy) -> st.SearchStrategy:
    """`rare` about one draw in n (st.one_of would not do: it draws a repeated branch as often as any other)."""
    return st.sampled_from(range(n)).flatmap(lambda i: rare if i == 0 else usual)


def spaced(texts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.builds(lambda before, text, after: before + text + after, SPACES, texts, SPACES)


def digits(width: int) -> st.SearchStrategy[str]:
    return st.text("0123456789", min_size=width, max_size=width)


def integers_in(low: int, high: int) -> st.SearchStrategy[str]:
    """Integer texts in a range, with signs, leading zeros and spaces."""
    return spaced(
        st.builds(
            lambda n, plus, zeros: ("-" if n < 0 else plus) + zeros + str(abs(n)),
            st.integers(low, high),
            st.sampled_from(["", "", "+"]),
            st.sampled_from(["", "", "0", "00"]),
        )
    )


def mostly(valid: st.SearchStrategy[str], *at_bounds: str) -> st.SearchStrategy[str]:
    """Valid texts, and one time in seven a text of the right type at or just past a validator's bound."""
    return one_time_in(7, spaced(st.sampled_from(at_bounds)), valid)


INTEGER_EDGES = [2**15, 2**31, 2**63]
integer_edges = st.one_of(
    st.integers(-(2**64), 2**64).map(str),
    st.sampled_from([str(sign * b + d) for b in INTEGER_EDGES for sign in (1, -1) for d in (-1, 0, 1)]),
    st.sampled_from(
        ["12.5", "1e3", "0x10", "", " ", "1 2", "\u0663", "1_000", "-", "+", "12a", "\t7", "7\n", "\uff11"]
    ),
)
DECIMAL_EDGES = [
    ".5", "5.", "-2e-3", "+.5e+3", "1e39", "-1e39", "3.4028235e38", "3.40282356e38", "3.4028236e38",
    "3.4028235677973366e38", "1.4e-45", "1e-46", "1e308", "1e309", "1e400", "1e-400", "nan", "inf", "-Infinity",
    "1.5.", "e5", "1e", ".", "-", "1,5", "0x1p3", "1_0.5", "1e+", "-0", "-0.0", " 0.5 ",
]  # fmt: skip
decimal_edges = st.one_of(st.floats(allow_nan=False, allow_infinity=False).map(repr), st.sampled_from(DECIMAL_EDGES))
boolean_words = st.sampled_from(["true", "t", "yes", "y", "1", "false", "f", "no", "n", "0"]).flatmap(
    lambda word: spaced(st.sampled_from([word, word.upper(), word.title()]))
)
boolean_edges = st.sampled_from(["tru", "2", "", "on", "off", "yes!", "\tyes", "ja", "-1", "true\n"])


def render_timestamp(moment: datetime, precision: str, separator: str, fraction: int, offset: str) -> str:
    text = moment.strftime("%Y-%m-%d")
    if precision == "day":
        return text
    text += separator + moment.strftime("%H:%M")
    if precision != "minute":
        text += moment.strftime(":%S")
    if precision == "fraction":
        text += "." + f"{moment.microsecond:06d}"[:fraction]
    return text + offset


def valid_timestamps(low: datetime = datetime(1900, 1, 1), high: datetime = datetime(2100, 1, 1)) -> st.SearchStrategy:
    """Texts the timestamp rule accepts: a date, perhaps a time to the minute, second or microsecond and an offset."""
    return spaced(
        st.builds(
            render_timestamp,
            st.datetimes(low, high),
            st.sampled_from(["day", "minute", "second", "fraction"]),
            st.sampled_from(["T", " "]),
            st.integers(1, 6),
            st.sampled_from(["", "", "Z", "+00:00", "-05:00", "+05:30", "+23:59", "-23:59", "-00:30"]),
        )
    )


# Instants an offset pushes out of years 0001-9999 (and the last ones inside), leap days, a day's last microsecond
TIMESTAMP_BOUNDS = [
    "0001-01-01T00:30+01:00", "0001-01-01T01:00:00+01:00", "0001-01-01 00:00:00Z", "0000-12-31T23:00:00-01:00",
    "9999-12-31T23:30:00-05:00", "9999-12-31T23:59:59.999999Z", "9999-12-31T19:00-05:00",
    "9999-12-31T18:59:59.999999-05:00",
    "2024-02-29T12:00Z", "2023-02-29T12:00Z", "2000-02-29", "1900-02-29", "2026-12-31T23:59:59.999999-23:59",
]  # fmt: skip
CLOCK_EDGES = st.builds(
    lambda separator, hour, minute, second, offset: f"{separator}{hour}:{minute}{second}{offset}",
    st.sampled_from(["T", " ", "t", "_"]),
    st.sampled_from(["00", "09", "23", "24", "7"]),
    st.sampled_from(["00", "59", "60"]),
    st.one_of(
        st.just(""),
        st.sampled_from([":00", ":59", ":60", ":5"]),
        st.integers(0, 7).flatmap(digits).map(lambda f: ":00." + f),
    ),
    st.sampled_from(["", "Z", "z", "+00:00", "-05:00", "+23:59", "+24:00", "-00:30", "+05:60", "+0530", "+05", "Z "]),
)
timestamp_edges = one_time_in(
    4,
    spaced(st.sampled_from(TIMESTAMP_BOUNDS)),
    spaced(
        st.builds(
            lambda year, month, day, clock: f"{year}-{month}-{day}{clock}",
            st.one_of(st.sampled_from(["0000", "0001", "1899", "1900", "1969", "2024", "2026", "9999"]), digits(4)),
            st.sampled_from(["00", "01", "02", "06", "12", "13", "1"]),
            st.sampled_from(["00", "01", "15", "28", "29", "30", "31", "32", "1"]),
            st.one_of(st.just(""), CLOCK_EDGES),
        )
    ),
)
PATTERN_FIELDS = ("yyyy", "MM", "dd", "HH", "mm", "ss")


def fill_pattern(pattern: str, fields: dict[str, str], wrong_literal: str | None = None) -> str:
    """A Spark datetime pattern with its fields filled in (and its literals replaced, to break it)."""
    text, rest = "", pattern
    while rest:
        token = next((t for t in PATTERN_FIELDS if rest.startswith(t)), None)
        text += fields[token] if token else rest[0] if wrong_literal is None else wrong_literal
        rest = rest[len(token) :] if token else rest[1:]
    return text


def pattern_fields(moment: datetime, padded: list[bool]) -> dict[str, str]:
    """A moment's fields as pattern text, each one or two digits wide where it may be."""
    values = [moment.month, moment.day, moment.hour, moment.minute, moment.second]
    fields = {t: f"{v:02d}" if pad else str(v) for t, v, pad in zip(PATTERN_FIELDS[1:], values, padded)}
    return {"yyyy": f"{moment.year:04d}", **fields}


def valid_patterned(
    patterns: tuple[str, ...], low: datetime = datetime(1900, 1, 1), high: datetime = datetime(2100, 1, 1)
) -> st.SearchStrategy[str]:
    """Texts one of `patterns` reads."""
    return spaced(
        st.builds(
            lambda pattern, moment, padded: fill_pattern(pattern, pattern_fields(moment, padded)),
            st.sampled_from(patterns),
            st.datetimes(low, high),
            st.lists(BOOLEANS, min_size=5, max_size=5),
        )
    )


PATTERN_FIELD_EDGES = st.fixed_dictionaries(
    {
        "yyyy": st.one_of(st.sampled_from(["0000", "0001", "1899", "2024", "9999"]), digits(3), digits(5)),
        "MM": st.sampled_from(["1", "01", "02", "12", "13", "0", "00", "123"]),
        "dd": st.sampled_from(["1", "01", "28", "29", "30", "31", "32", "0"]),
        "HH": st.sampled_from(["0", "00", "09", "23", "24"]),
        "mm": st.sampled_from(["0", "00", "59", "60"]),
        "ss": st.sampled_from(["0", "00", "59", "60"]),
    }
)


def patterned_edges(patterns: tuple[str, ...]) -> st.SearchStrategy[str]:
    """Texts shaped like one of `patterns`, with fields of every width and value edge, or wrong literals."""
    return spaced(
        st.builds(
            fill_pattern,
            st.sampled_from(patterns),
            PATTERN_FIELD_EDGES,
            st.sampled_from([None, None, None, None, "-", "/", "", "x", "T"]),
        )
    )


UNICODE_BITS = "aZ \u00e9\u00df\u0130\u212a\u2028\u00a0\u0663\U0001f600\t\n\x0b\x00\x1f\"\\/'@.-_"
plain_texts = st.one_of(st.text(UNICODE_BITS, max_size=8), st.text(max_size=6))
words = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", min_size=1, max_size=8)
identifiers = st.text("abcdef0123456789-_", min_size=1, max_size=12)
names = st.lists(words, min_size=1, max_size=3).map(" ".join)
name_edges = st.one_of(
    st.sampled_from(["  Carl  Zed ", "J0hn Doe", "", "   ", "\u00c9va Nagy", "O'Neil Mary-Ann", "Ann\n", "Ann\x0bLee"]),
    st.text("ab AB\u00e9'-0\n\x0b", max_size=10),
)
emails = st.builds(
    lambda user, domain, tld: f"{user}@{domain}.{tld}", identifiers, words, st.sampled_from(["com", "io"])
)
email_edges = st.builds(
    lambda user, domain, tld, end: f"{user}@{domain}.{tld}{end}",
    st.sampled_from(["ann", "a.b", "x y", "", "a\x0bb", "\u00e9", "a\tb"]),
    st.sampled_from(["example", "ex-ample", "", "a@b"]),
    st.sampled_from(["com", "COM", "c0m", "", "io"]),
    st.sampled_from(["", "\n", " ", "\t", "\x0b"]),
)


def choices(*known: str) -> st.SearchStrategy[str]:
    """Mapping keys, in any case."""
    return st.sampled_from(known).flatmap(lambda w: st.sampled_from([w, w.lower(), w.upper()]))


# the Kelvin sign and a dotted capital I lower-case to ASCII letters; a capital sigma lower-cases by context in Python
choice_edges = st.sampled_from(
    [
        "",
        "x",
        "\u212a",
        "gold\n",
        " gold",
        "silver\x0b",
        "Call",
        "\u0130",
        "S\u0130LVER",
        "\u03a3\u03a3",
        "BRONZE\u03a3",
    ]
)


# ---- JSON: values as tokens, records as objects, and broken records --------------------------------------

NUMBER_TOKENS = [
    "1.50", "-0", "-0.0", "1E3", "1e400", "-1e400", "1e22", "1e21", "1e16", "1e15", "1e-7", "5e-324", "0.1",
    "1.5e00001", "12345678901234567890", "-9223372036854775809", "18446744073709551616", "123456789.125", "0e0",
    "2.5E-3", "0.000001", "NaN", "-Infinity", "Infinity", "inf", "-nan", "INF",
]  # fmt: skip


def string_token(texts: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A text as a JSON string, escaped every way JSON allows (\\uXXXX, surrogate pairs, '\\/')."""
    return st.builds(
        lambda text, ascii_only, slash: json.dumps(text, ensure_ascii=ascii_only).replace("/", slash),
        texts,
        BOOLEANS,
        st.sampled_from(["/", "/", "\\/"]),
    )


def key_token(name: str) -> st.SearchStrategy[str]:
    """A key, mostly plain, sometimes with its first character escaped (the key is the decoded text)."""
    escaped = '"' + "".join(f"\\u{ord(c):04x}" if c == name[0] else c for c in name) + '"'
    return one_time_in(5, st.just(escaped), st.just(json.dumps(name)))


number_tokens = st.one_of(
    st.sampled_from(NUMBER_TOKENS),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
)
scalar_tokens = st.one_of(string_token(plain_texts), number_tokens, st.sampled_from(["true", "false", "null"]))
SPACING = st.sampled_from(["", " ", "\n", "\t", "\r\n "])


def render_object(pairs: list[tuple[str, str]], spacing: str = "", trailing: bool = False) -> str:
    body = f",{spacing}".join(f"{key}:{spacing}{value}" for key, value in pairs)
    return "{" + spacing + body + ("," if trailing and pairs else "") + spacing + "}"


def render_array(items: list[str], spacing: str = "", trailing: bool = False) -> str:
    return "[" + f",{spacing}".join(items) + ("," if trailing and items else "") + "]"


nested_keys = string_token(st.sampled_from(["x", "y", "x", "\u00e9", "a\nb", ""]))
nested_tokens = st.recursive(
    scalar_tokens,
    lambda inner: st.one_of(
        st.builds(render_array, st.lists(inner, max_size=3), SPACING, BOOLEANS),
        st.builds(render_object, st.lists(st.tuples(nested_keys, inner), max_size=3), SPACING, BOOLEANS),
    ),
    max_leaves=6,
)


@dataclass(frozen=True)
class Column:
    """How a source column's values are drawn: mostly valid, or at one of its rule's edges."""

    valid: st.SearchStrategy[str]
    edges: st.SearchStrategy[str]
    optional: bool = False  # absent from one valid record in three


class RecordShape:
    """The tokens of a pipeline's source columns, built once: key, valid value, edge value."""

    def __init__(self, columns: dict[str, Column]):
        self.columns = columns
        self.keys = {name: key_token(name) for name in columns}
        self.valid = {name: string_token(column.valid) for name, column in columns.items()}
        self.edges = {name: string_token(column.edges) for name, column in columns.items()}
        # which columns a record breaks: none to two, or one record in six all of them
        self.broken = one_time_in(6, st.just(set(columns)), st.sets(st.sampled_from(list(columns)), max_size=2))


BREAKS = st.sampled_from(["edge", "edge", "edge", "absent", "null", "number", "nested"])
ABSENT_IF_OPTIONAL = st.sampled_from([True, False, False])
BROKEN_VALUES = {"null": st.just("null"), "number": number_tokens, "nested": nested_tokens}
EXTRA_PAIRS = st.lists(
    st.tuples(string_token(st.sampled_from(["extra", "ORG_ID", "org_id ", "Id"])), scalar_tokens), max_size=2
)
REPEAT_A_KEY = st.sampled_from([True, False, False, False, False])
TRAILING_COMMA = st.sampled_from([True, False, False, False])
BEFORE, AFTER = st.sampled_from(["", "", " ", "\n"]), st.sampled_from(["", "", "\n", "\r\n"])


@st.composite
def json_records(draw: st.DrawFn, shape: RecordShape) -> bytes:
    """One JSON object: every column valid except a few drawn at an edge (absent, null, an edge text, a
    number, a nested value), unknown and repeated keys, any order, spacing and trailing comma."""
    broken = draw(shape.broken)
    pairs = []
    for name, column in shape.columns.items():
        key = draw(shape.keys[name])
        if name not in broken:
            if not (column.optional and draw(ABSENT_IF_OPTIONAL)):
                pairs.append((key, draw(shape.valid[name])))
            continue
        kind = draw(BREAKS)
        if kind == "edge":
            pairs.append((key, draw(shape.edges[name])))
        elif kind != "absent":
            pairs.append((key, draw(BROKEN_VALUES[kind])))
    pairs += draw(EXTRA_PAIRS)
    if pairs and draw(REPEAT_A_KEY):  # a key again, before or after: the first occurrence wins
        key = draw(st.sampled_from(pairs))[0]
        pairs.insert(draw(st.integers(0, len(pairs))), (key, draw(scalar_tokens)))
    pairs = draw(st.permutations(pairs))
    text = render_object(pairs, draw(SPACING), draw(TRAILING_COMMA))
    return (draw(BEFORE) + text + draw(AFTER)).encode()


CORRUPTIONS = st.sampled_from(
    ["truncate", "top_level", "utf8", "empty", "oversized", "junk", "before", "control", "surrogate", "bytes"]
)
NOT_OBJECTS = st.sampled_from([b"[1, 2]", b'"x"', b"null", b"3", b"true", b'[{"org_id": "o"}]', b" [] ", b"NaN"])
NOT_UTF8 = st.sampled_from([b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"])
NOTHING = st.sampled_from([b"", None])
JUNK_AFTER = st.sampled_from([b" x", b"}", b"{}", b",", b"\x00", b" // c", b"\xef\xbb\xbf"])
JUNK_BEFORE = st.sampled_from([b"\xef\xbb\xbf", b"\x0b", b"\x0c", b"\xc2\xa0", b"\x00"])  # a BOM, not JSON's spaces
CONTROLS = st.sampled_from([b"\x01", b"\t", b"\n", b"\x1f"])
LONE_SURROGATES = st.sampled_from([b"\\ud800", b"\\udfff", b"\\ud83dx", b"\\ude00\\ud83d"])  # no UTF-8 text holds one
NOISE = st.binary(max_size=30)
OVER_BY = st.integers(0, 40)


@st.composite
def corrupted(draw: st.DrawFn, good: bytes, limit: int) -> bytes | None:
    """A broken record: cut short, not an object, not UTF-8, empty, too large, junk around it, or noise."""
    kind = draw(CORRUPTIONS)
    if kind == "truncate":
        return good[: draw(st.integers(0, max(len(good) - 1, 0)))]
    if kind == "utf8":
        at = draw(st.integers(0, len(good)))
        return good[:at] + draw(NOT_UTF8) + good[at:]
    if kind == "oversized":  # valid JSON, at the limit or a few bytes over it
        return b" " * (max(limit - len(good), 0) + draw(OVER_BY)) + good
    if kind in ("control", "surrogate"):  # a raw control character or a lone surrogate's escape inside a string
        value = re.search(rb'":\s*"', good)  # where a string value starts
        at = value.end() if value else 0
        return good[:at] + draw(CONTROLS if kind == "control" else LONE_SURROGATES) + good[at:]
    if kind == "junk":
        return good + draw(JUNK_AFTER)
    if kind == "before":
        return draw(JUNK_BEFORE) + good
    return draw({"top_level": NOT_OBJECTS, "empty": NOTHING, "bytes": NOISE}[kind])


BATCH_SIZE = st.integers(1, 16)
CORRUPT = st.sampled_from([True, False, False, False, False, False])


@st.composite
def batches(draw: st.DrawFn, shape: RecordShape, limit: int) -> list[bytes | None]:
    records = []
    for _ in range(draw(BATCH_SIZE)):
        good = draw(json_records(shape))
        records.append(draw(corrupted(good, limit)) if draw(CORRUPT) else good)
    return records
