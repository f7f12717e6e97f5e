"""The keyword arguments of the Definitions, from the registered streams and the platform's parts.

Each stream contributes its Dagster parts. The tables several streams write are assets of their lake
(engagement/assets.py, profiles/assets.py), downstream of their writers: each stream that declares a
table among its `tables` is put among that table asset's deps, so a new stream writing a shared table
needs no edit of the lake's asset list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import AssetKey, AssetSpec

from engagement_platform.orchestration.kafka_stream import KafkaStream
from engagement_platform.orchestration.parts import combine
from engagement_platform.streams.definition import StreamDefinition


def assemble(streams: Sequence[StreamDefinition], platform: Sequence[Any]) -> dict[str, list[Any]]:
    """Every stream's parts, then the platform's (shared tables, upkeeps, consumers), each table asset
    downstream of the streams that declare they write it."""
    parts = [stream.parts() for stream in streams]
    kinds = combine(*parts, *platform)
    kinds["assets"] = with_writers(kinds["assets"], table_writers(streams, parts))
    return kinds


def writer_key(stream: StreamDefinition, parts: Any) -> AssetKey:
    """The asset whose runs commit the stream's tables: the one it names, else its Kafka stream asset."""
    if stream.asset is not None:
        return AssetKey.from_user_string(stream.asset)
    if isinstance(parts, KafkaStream):
        return parts.definition.asset_key
    raise ValueError(f"{stream.name} declares the tables it writes but not the asset that writes them (`asset`)")


def table_writers(streams: Sequence[StreamDefinition], parts: Sequence[Any]) -> dict[str, list[AssetKey]]:
    """Table name -> the assets of the streams that write it, in registry order."""
    writers: dict[str, list[AssetKey]] = {}
    for stream, own in zip(streams, parts, strict=True):
        for table in stream.tables:
            writers.setdefault(table.name, []).append(writer_key(stream, own))
    return writers


def with_writers(assets: Sequence[Any], writers: Mapping[str, Sequence[AssetKey]]) -> list[Any]:
    """`assets` with each table's AssetSpec depending on every writer of the table it does not list yet. A
    table that is a stream's own asset (profile_cdc_staging, profile_segments) is no AssetSpec: left alone."""
    out = []
    for a in assets:
        if isinstance(a, AssetSpec):
            listed = {dep.asset_key for dep in a.deps}
            missing = [k for k in writers.get(a.key.to_user_string(), ()) if k not in listed and k != a.key]
            if missing:
                a = a.merge_attributes(deps=missing)
        out.append(a)
    return out
