"""Ingestion stream: Kafka activities -> engagement_activity, quarantine and notifications."""
