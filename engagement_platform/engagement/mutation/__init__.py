"""ID mutation stream: convert / merge / delete / update requests, cascade-reduced, applied in one MERGE."""
