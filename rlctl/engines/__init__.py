"""rlctl.engines."""
