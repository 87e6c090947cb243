"""CLI commands (placeholder, being written)."""
