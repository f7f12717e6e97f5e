"""The only place Definitions are assembled (named by pyproject's [tool.dagster] and workspace.yaml): the
parts of every registered stream (registry.py), and beside them the platform's parts that belong to no
one stream: each lake's shared tables, its upkeep, and the example consumer of its changes.

The landing pipelines come from the YAML files in EP_PIPELINES_DIR (default: the repo's pipelines/): each
adds its landing folder, pipeline asset (with checks), tables, job and landing sensor.
"""

from collections.abc import Sequence
from typing import Any

from dagster import Definitions, in_process_executor

from engagement_platform.engagement.assets import ENGAGEMENT_TABLES
from engagement_platform.engagement.metrics.assets import METRICS
from engagement_platform.engagement.upkeep.assets import UPKEEP
from engagement_platform.landing.jobs import LANDING_UPKEEP
from engagement_platform.orchestration.assembly import assemble
from engagement_platform.profiles.assets import PROFILE_TABLES
from engagement_platform.registry import STREAMS
from engagement_platform.resources import platform_resources
from engagement_platform.streams.definition import RegistryEntry, expand

PLATFORM = (ENGAGEMENT_TABLES, UPKEEP, METRICS, LANDING_UPKEEP, PROFILE_TABLES)


def definitions_for(streams: Sequence[RegistryEntry] = STREAMS, platform: Sequence[Any] = PLATFORM) -> Definitions:
    """The Definitions of these streams (a registry with a stream of one's own added, in a test) and parts.

    Every job runs its steps in the run's own process: a step in a subprocess of its own (Dagster's default
    executor) would start another interpreter and import the platform again, for no parallelism a batch needs."""
    return Definitions(
        **assemble(expand(streams), platform), resources=platform_resources(), executor=in_process_executor
    )


defs = definitions_for()
