"""Profile segments: many segment definitions evaluated over each merged profile in one pass.

Segmentation is the consumer of the unified profile in Adobe's "Massive Data Processing in Adobe Using Delta
Lake" (Data+AI Summit 2021).
"""
