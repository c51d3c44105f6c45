"""The shipped Hydra config groups, importable as `synodic.conf` so an installed package finds them
(`pkg://synodic.conf`) without a path relative to a checkout."""
