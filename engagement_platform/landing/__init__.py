"""Landing-file pipelines (reference 003): one stream per pipelines/*.yaml, a batch per set of files waiting."""
