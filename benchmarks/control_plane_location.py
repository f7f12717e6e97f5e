"""The code location the control-plane benchmark launches runs of: the whole platform, plus a job whose one step
is where a stream's code would start. A run of it costs what the platform's fixed cost per run is: a worker that
imports and loads the platform's definitions, starts, runs a step that does nothing, and tears down."""

from dagster import Definitions, in_process_executor, job, op

from engagement_platform.definitions import defs as platform


@op
def first_line_of_a_stream() -> None:
    """Nothing: the benchmark measures everything around this point."""


@job(executor_def=in_process_executor)
def control_plane_noop_job() -> None:
    first_line_of_a_stream()


defs = Definitions.merge(platform, Definitions(jobs=[control_plane_noop_job]))
