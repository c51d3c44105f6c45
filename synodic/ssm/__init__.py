"""SSM state backends (`ssm` group): eager state read+write, and ReplaySSM checkpoint + ring."""
