"""Algorithm presets: TOML fragments layered beneath a profile by ``algorithm.preset``."""
