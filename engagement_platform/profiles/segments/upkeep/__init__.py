"""Upkeep of segment membership: each tenant's change log folded into its compacted base (compaction.py's work)."""
