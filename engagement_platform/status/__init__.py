"""`engagement-platform status`: per stream (and per tenant), the latest batch and its state, its attempts,
who holds its lock, its lag in records and seconds, whether it is paused and how to resume it.

report.py    what the command prints (text or one JSON document): pure, no I/O, no Dagster
streams.py   which streams exist (the one place that asks the catalog)
collect.py   the reads: checkpoint store, ZooKeeper, Kafka watermarks; each service that does not answer
             makes its columns "unavailable" instead of failing the command
runs.py      the Dagster run storage: attempts of a batch, and the pause the sensors apply
"""
