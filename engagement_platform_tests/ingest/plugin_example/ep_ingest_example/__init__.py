"""Example ingest plugins another team ships in its own package (see plugins.py and pyproject.toml)."""
