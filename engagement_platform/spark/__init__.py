"""Spark sessions (Spark Connect) and the Python data sources that read Kafka offsets and landing files inside Spark tasks (no Dagster)."""
