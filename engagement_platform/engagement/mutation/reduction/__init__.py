"""The exact cascade reduction (pure logic), its slow reference, and its Spark form."""
