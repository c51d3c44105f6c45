"""Model substrate: the hybrid decoder LM (Mamba-2 / Gated DeltaNet / attention / MLP blocks)."""
from .config import HybridConfig
from .lm import DecodeContext, HybridLM, PrefillContext
from .presets import PRESETS

__all__ = ["PRESETS", "DecodeContext", "HybridConfig", "HybridLM", "PrefillContext"]
