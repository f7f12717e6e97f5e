"""The Dagster side of the stream framework: a stream definition becomes its asset, sensor, job and common checks."""
