"""rlctl.bench."""
