"""The unified-profile CDC lake (reference 002): its tables, records, JSON merge and identity graph."""
