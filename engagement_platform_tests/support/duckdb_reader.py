"""An independent Delta reader for the tests: DuckDB's delta extension (built on delta-kernel-rs, not on
delta-rs), loaded from the `duckdb-ext-delta` wheel (DuckDB's own INSTALL downloads, which these machines
cannot)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa


def extension_path() -> str:
    import duckdb_ext  # namespace package of the duckdb-ext-* wheels

    root = Path(next(iter(duckdb_ext.__path__)))
    (found,) = root.glob(f"extensions/v{duckdb.__version__}/*/delta.duckdb_extension")
    return str(found)


def read_delta(table_uri: str, columns: list[str]) -> pa.Table:
    """The table's current rows as DuckDB reads them, sorted by `columns` (which it returns)."""
    with duckdb.connect() as con:
        con.execute(f"LOAD '{extension_path()}'")
        order = ", ".join(f'"{c}"' for c in columns)
        return con.execute(f"SELECT {order} FROM delta_scan(?) ORDER BY {order}", [table_uri]).fetch_arrow_table()


def same_rows(reference: pa.Table, table_uri: str, columns: list[str]) -> bool:
    """Whether DuckDB reads exactly the rows `reference` (deltalake's read) holds, compared as Python values."""
    theirs = read_delta(table_uri, columns).to_pylist()
    ours = reference.select(columns).sort_by([(c, "ascending") for c in columns]).to_pylist()
    return theirs == ours
