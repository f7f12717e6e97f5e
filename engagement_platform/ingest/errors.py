"""The one error schema every stage and plugin reports in, as Spark columns.

Inside a pipeline each row carries `_errors`, an array of error structs (stage, plugin, column_name,
error_code, message, value). A plugin reports an error on a row by producing such a struct (or null
when the row is fine); the pipeline gathers them, so every error of every stage looks the same and
can be unioned, counted and joined back to the input by `_row_id`.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

ROW_ID = "_row_id"  # stable per source position (file line, Kafka partition/offset), not per run
ERRORS = "_errors"
RAW = "_raw"  # the record's original bytes: only rows with errors carry them out of Spark
SOURCE_PARTITION = "_source_partition"
SOURCE_OFFSET = "_source_offset"  # the file's line number, or the Kafka offset
SYSTEM_COLUMNS = (ROW_ID, ERRORS, RAW, SOURCE_PARTITION, SOURCE_OFFSET)

ERROR_FIELDS = ("stage", "plugin", "column_name", "error_code", "message", "value")
ERROR_STRUCT_DDL = "struct<stage:string,plugin:string,column_name:string,error_code:string,message:string,value:string>"
ERROR_FRAME_DDL = f"{ROW_ID} long, " + ", ".join(f"{f} string" for f in ERROR_FIELDS)

PARSE, CONVERT, VALIDATE = "parse", "convert", "validate"


def error(
    stage: str, plugin: str, column: str | None, code: str, message: Column | str, value: Column | None = None
) -> Column:
    """One error struct; `message` may be a literal or a column (to quote the offending value)."""
    return F.struct(
        F.lit(stage).alias("stage"),
        F.lit(plugin).alias("plugin"),
        F.lit(column).cast("string").alias("column_name"),
        F.lit(code).alias("error_code"),
        (F.lit(message) if isinstance(message, str) else message).alias("message"),
        (value if value is not None else F.lit(None)).cast("string").alias("value"),
    )


def no_errors() -> Column:
    return F.array().cast(f"array<{ERROR_STRUCT_DDL}>")


def gather(errors: list[Column]) -> Column:
    """The non-null ones of several error-or-null columns, as an array.

    A concat of one-element-or-empty arrays, not array_compact: that is a lambda (filter), which
    Spark does not compile, so the projection holding it (every check of a stage) would run
    interpreted, row by row. An error is evaluated a second time only on rows that have it."""
    if not errors:
        return no_errors()
    return F.concat(*[F.when(e.isNotNull(), F.array(e)).otherwise(no_errors()) for e in errors])
