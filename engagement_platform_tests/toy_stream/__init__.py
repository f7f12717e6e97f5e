"""A toy Kafka-fed stream in a package of its own, as a user adds one: apply.py (its spec), assets.py (the
Kafka stream factory) and stream.py (its definition, registered with one line)."""
