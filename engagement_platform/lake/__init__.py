"""Delta tables over delta-rs: table specs, commits with txn ids, the checkpoint store, notifications and change reads (no Dagster)."""
