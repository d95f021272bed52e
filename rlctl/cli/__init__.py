"""rlctl.cli."""
