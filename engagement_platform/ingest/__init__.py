"""The composable ingest framework: pipeline config, parse -> convert -> validate plugins, the one error schema (no Dagster)."""
