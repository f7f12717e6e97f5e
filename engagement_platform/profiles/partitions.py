"""Dynamic partitions of the profile CDC lake: dumper batches (zero-padded batch id) and tenants."""

from dagster import DynamicPartitionsDefinition

profile_cdc_batches = DynamicPartitionsDefinition(name="profile_cdc_batches")
# One per tenant: the processor sensor adds a tenant when its first changes are staged.
profile_tenants = DynamicPartitionsDefinition(name="profile_tenants")
