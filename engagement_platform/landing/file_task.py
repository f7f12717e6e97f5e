"""A landing batch's Spark task: over the validated records of its part of a file, it splits the target rows
from the rejected ones, drops the records naming an erased subject, writes the target rows into the target
table's folder as Parquet files and hands back the file actions, the quarantine rows, the suppressed hashes
and its counts. The target rows never travel to the driver; the driver commits the files."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa

from engagement_platform.ingest.config import PipelineConfig
from engagement_platform.ingest.pipeline import QuarantineContext, split_result
from engagement_platform.ingest.tables import target_spec
from engagement_platform.lake.file_writes import WrittenFile, write_files
from engagement_platform.lake.suppression import Suppressed
from engagement_platform.lake.suppression_tables import hits_table
from engagement_platform.landing.suppressed import drop_suppressed_records
from engagement_platform.spark.handoff import handoff

FILES, QUARANTINE, SUPPRESSED, COUNTS = "files", "quarantine", "suppressed", "counts"  # handoff kinds


@dataclass(frozen=True)
class FileTask:
    """What every task of one landing file needs: where to write, and what the rows are stamped with."""

    config: PipelineConfig
    source: str  # the file, as the quarantine's `source` names it
    batch_id: int
    at: datetime
    table_uri: str
    tag: str  # writer_tag of the batch: files of a dead attempt are found by it
    write: bool  # False on a re-run whose target commit is already there: nothing is written again
    storage_options: Mapping[str, str] | None = None
    suppressed: Suppressed | None = None

    def target_rows(self, good: pa.Table) -> pa.Table:
        n = good.num_rows
        return good.append_column("batch_id", pa.repeat(pa.scalar(self.batch_id, pa.int64()), n)).append_column(
            "ingested_at", pa.repeat(pa.scalar(self.at, pa.timestamp("us", tz="UTC")), n)
        )

    def function(self) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
        columns = list(self.config.target.columns)
        context = QuarantineContext(self.config.name, self.batch_id, self.source, self.at)

        def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            read = list(batches)
            if not read:
                return
            result = pa.Table.from_batches(read)
            good, quarantine = split_result(result, columns, context)
            hits: list[tuple[str, str]] = []
            if self.suppressed and self.config.suppression:
                good, quarantine, hits = drop_suppressed_records(
                    good, quarantine, self.config.suppression, self.suppressed
                )
            rows = self.target_rows(good)
            spec = target_spec(self.config)
            files = write_files(self.table_uri, spec, rows, self.tag, self.storage_options) if self.write else []
            yield from handoff(FILES, pa.table({"file": pa.array([f.to_json() for f in files], pa.string())}))
            yield from handoff(QUARANTINE, quarantine)
            yield from handoff(SUPPRESSED, hits_table(hits))
            yield from handoff(COUNTS, pa.table({"read": [result.num_rows], "written": [good.num_rows]}))

        return run


def written_files(handed: Mapping[str, pa.Table]) -> list[WrittenFile]:
    return [WrittenFile.from_json(text) for text in handed[FILES]["file"].to_pylist()] if FILES in handed else []
