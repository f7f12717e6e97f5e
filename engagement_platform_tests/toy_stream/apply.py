"""The toy stream's batch: the slice's records, read on the driver, appended to one Delta table with the
batch's txn (app id, batch id), so a re-run of the batch appends nothing twice."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from engagement_platform.lake.delta import TableSpec
from engagement_platform.streams.batch import CommitStep, commit_batch
from engagement_platform.streams.kafka import KafkaClient
from engagement_platform.streams.planning import BatchPlan
from engagement_platform.streams.spec import BatchContext, StreamSpec, batch_metadata

TOY_EVENTS = TableSpec(
    name="toy_events",
    schema=pa.schema(
        [
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.string()),
            ("value", pa.string()),
            ("batch_id", pa.int64()),
        ]
    ),
    change_data_feed=False,
    description="Every record of the toy topic, once.",
)


@dataclass
class ToyResult:
    plan: BatchPlan
    records_read: int
    versions: dict[str, int | None]

    def metadata(self) -> dict:
        return batch_metadata(self.plan, self.versions, {}, records_read=self.records_read)


def run_batch(ctx: BatchContext, plan: BatchPlan) -> ToyResult:
    messages = list(KafkaClient(ctx.kafka_servers).read_range(plan.topic, plan.ranges))
    rows = pa.table(
        {
            "partition": [m.partition for m in messages],
            "offset": [m.offset for m in messages],
            "key": [m.key.decode() if m.key is not None else None for m in messages],
            "value": [m.value.decode() if m.value is not None else None for m in messages],
            "batch_id": [plan.batch_id] * len(messages),
        },
        schema=TOY_EVENTS.schema,
    )
    versions = commit_batch(
        plan,
        "toy.events",
        [CommitStep(TOY_EVENTS.name, lambda txn, _: ctx.lake.append(TOY_EVENTS, rows, txn))],
        ctx.checkpoints,
    )
    return ToyResult(plan, len(messages), dict(versions))


SPEC = StreamSpec(name="toy", app_id="toy.events", run_batch=run_batch)  # no lock: an append-only stream
