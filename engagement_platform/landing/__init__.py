"""Landing-file pipelines (reference 003): one stream per pipelines/*.yaml, one batch per landed file."""
