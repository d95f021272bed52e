"""rlctl.profile."""
