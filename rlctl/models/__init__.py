"""rlctl.models."""
