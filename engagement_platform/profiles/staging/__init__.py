"""CDC dumper stream: profile.cdc -> the append-only staging table and quarantine."""
