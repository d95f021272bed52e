"""rlctl.data."""
