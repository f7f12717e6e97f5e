"""The engagement activity lake: its tables and its streams.

The design follows Salesforce's "A High Performance Mutable Engagement Activity Delta Lake" (Data+AI Summit
2021) and its job coordinator, "Global Synchronousness and Ordering in Delta Lake" (Salesforce engineering).
"""
