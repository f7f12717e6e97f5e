"""The unified-profile CDC lake: its tables, records, JSON merge and identity graph.

The design follows Adobe's "Massive Data Processing in Adobe Using Delta Lake" (Data+AI Summit 2021): CDC
staged per tenant and 15-minute bucket, per-tenant raw tables merged by a processor with a progress map.
"""
