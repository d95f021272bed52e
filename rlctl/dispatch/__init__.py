"""rlctl.dispatch."""
