"""TTL / GDPR retention stream: org retention and subject erasure across every table, audited."""
