"""Daily engagement metrics: a downstream consumer of engagement_activity that reads only its changes."""
