"""rlctl.reshard."""
