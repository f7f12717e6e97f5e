"""The stream registry without servers: run-batch resolves every stream's name through it (families and a
landing pipeline's checkpoint name included) and refuses what names no batch before anything runs; every
entry's Dagster parts, writer asset and settings section exist; and resolving a name loads no Dagster."""

import dataclasses
import subprocess
import sys

import pytest
from dagster import AssetKey

from engagement_platform.definitions import defs
from engagement_platform.lake.checkpoints import CheckpointStore
from engagement_platform.lake.delta import DeltaLake
from engagement_platform.orchestration.kafka_stream import KafkaStream
from engagement_platform.registry import STREAMS, batch_run, find_stream, stream_names
from engagement_platform.settings import Settings
from engagement_platform.streams.by_hand import BatchRequestError
from engagement_platform.streams.definition import expand
from engagement_platform.streams.planning import BatchPlan, FileSlice
from engagement_platform_tests.support.stack import REPO


@pytest.fixture
def checkpoints(tmp_path) -> CheckpointStore:  # a local lake: no server
    return CheckpointStore(DeltaLake(str(tmp_path / "lake")))


def test_run_batch_names_every_registered_stream():
    assert stream_names() == [
        "ingestion",
        "mutation",
        "retention",
        "profile_cdc",
        "profile_erasure",
        "profile_processor/<tenant>",
        "profile_backfill/<tenant>",
        "profile_segments/<tenant>",
        "ingest/<pipeline>",
    ]
    definition, member = find_stream("profile_processor/tenant01")
    assert (definition.name, member) == ("profile_processor/<tenant>", "tenant01")
    by_name, by_checkpoint = find_stream("ingest/rewards_members"), find_stream("ingest.rewards_members")
    assert by_name[0].name == by_checkpoint[0].name == "ingest/rewards_members"
    assert find_stream("profile_processor/") is None and find_stream("ingest/no_such_pipeline") is None


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("no_such_stream",), "unknown stream 'no_such_stream': one of ingestion, mutation, retention, profile_cdc"),
        (("mutation",), "mutation needs --batch-id (a batch its sensor planned)"),
        (("mutation", 3), "no plan for mutation batch 3"),
        (("ingest.rewards_members",), "ingest.rewards_members needs --batch-id"),
        (("profile_processor/Not A Tenant",), "tenant 'Not A Tenant' does not match"),
        (("profile_processor/tenant01", 5), "profile_processor/tenant01 batch 5 is not an unfinished batch"),
        (("profile_segments/tenant01", 2), "(nothing planned yet); run without --batch-id to plan the next one"),
        (("profile_backfill/tenant01", None, "export/"), "profile_backfill/tenant01 needs --path and --until"),
    ],
)
def test_a_request_that_names_no_batch_is_refused_before_anything_runs(checkpoints, args, error):
    with pytest.raises(BatchRequestError) as refused:
        batch_run(args[0], checkpoints, *args[1:])
    assert error in str(refused.value)


def test_a_planned_or_self_planning_batch_resolves_to_its_run(checkpoints):
    checkpoints.record_plan(BatchPlan("ingest.rewards_members", 1, FileSlice("/landing/members-1.csv", 10)))
    assert callable(batch_run("ingest/rewards_members", checkpoints, 1))
    assert callable(batch_run("ingest.rewards_members", checkpoints, 1))
    assert callable(batch_run("profile_processor/tenant01", checkpoints))  # plans its next batch when run
    assert callable(batch_run("profile_backfill/tenant01", checkpoints, None, "export/", "2026-01-05T12:00:00Z"))


def test_every_entry_names_parts_an_asset_and_a_settings_section_that_exist():
    assets = defs.get_repository_def().asset_graph.get_all_asset_keys()
    sections = {field.name for field in dataclasses.fields(Settings)}
    for definition in expand(STREAMS):
        parts = definition.parts()
        if isinstance(parts, KafkaStream):
            assert parts.definition.spec is definition.spec
        if definition.spec is not None:  # run-batch finds a stream's stored plans by its name
            assert definition.spec.name in (definition.name, *definition.aliases)
        else:
            assert definition.family is not None, definition.name
        if definition.asset is not None:
            assert AssetKey.from_user_string(definition.asset) in assets, definition.name
        assert definition.settings_section in sections | {None}, definition.name
        assert definition.run_batch is not None, definition.name


def test_resolving_a_stream_loads_no_dagster():
    """run-batch is a process per batch in the crash tests: the registry and the adapters import no Dagster."""
    probe = "import sys, engagement_platform.registry; assert 'dagster' not in sys.modules, 'dagster was imported'"
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
