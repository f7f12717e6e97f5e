"""Profile segments: many segment definitions evaluated over each merged profile in one pass (reference 002)."""
