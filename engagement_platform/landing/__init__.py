"""Landing-file pipelines: one stream per pipelines/*.yaml, a batch per set of files waiting.

Config-driven parse, convert and validate plugins with row-level error capture, after Adobe's "Composable
Data Processing with Apache Spark" (Spark+AI Summit).
"""
