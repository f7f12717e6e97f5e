"""Processor stream: per tenant, staged changes merged into the raw table under the tenant lock; a run merges a group of tenants."""
