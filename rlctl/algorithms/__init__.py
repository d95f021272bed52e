"""rlctl.algorithms."""
