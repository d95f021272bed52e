"""rlctl.platforms."""
