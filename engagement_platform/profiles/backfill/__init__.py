"""Backfill stream: a hot-store snapshot export loaded into a tenant raw table, ordered against CDC."""
