"""Quality metrics: held-out bits per byte / perplexity and teacher-forced model comparison."""
from .metrics import bits_per_byte, compare, heldout_metrics, nll, token_stream

__all__ = ["bits_per_byte", "compare", "heldout_metrics", "nll", "token_stream"]
