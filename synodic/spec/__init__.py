"""Speculative decoding schemes (`spec` group)."""
