"""rlctl.rewards."""
