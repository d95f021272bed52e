"""rlctl.doctor."""
