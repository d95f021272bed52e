"""A toy out-of-tree vendor: its platform file and its pin data, nothing else (docs/platforms.md)."""
