"""Soak benchmark: the whole platform (stack, Dagster daemon and its sensors) under a deterministic workload and
injected faults, then every table reconciled with an independent oracle. Run `python -m benchmarks.soak --help`."""
