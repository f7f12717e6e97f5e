"""The exact cascade reduction (pure logic), and its slow reference."""
