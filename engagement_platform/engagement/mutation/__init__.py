"""ID mutation stream: convert / merge / delete / update requests, cascade-reduced and applied by Spark tasks, one commit."""
