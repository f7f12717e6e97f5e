"""The batch lifecycle every stream shares: slices and plans, pins, fenced commits, the ZooKeeper coordinator, Kafka reads (no Dagster)."""
