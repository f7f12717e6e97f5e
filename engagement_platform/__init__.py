"""Mutable, multi-stream Delta lakes as Dagster assets: a stream framework and the streams built on it."""
