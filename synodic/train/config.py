"""`pipeline=train`: the knobs of a training run (the model comes from the run's `model` group)."""
from typing import Annotated, Literal

from pydantic import Field, field_validator

from synodic.config.registry import Component, register

# batch_size=null picks by device: the shipped models were trained at 32 x 2048 on a GPU; on the CPU
# that is ~23 GiB of fp32 activations (synodic/config/budget.py), so a 2-core / 24 GiB machine gets 4.
GPU_BATCH, CPU_BATCH = 32, 4


def default_batch(device_type: str) -> int:
    return GPU_BATCH if device_type == "cuda" else CPU_BATCH


def tokenizer_problem(v: str) -> str | None:
    """Why `v` is not shipped, train or a tokenizer.json the corpus cache can hold (None when it is)."""
    from synodic.config.files import text_problem
    what = "shipped, train or a tokenizer.json file"
    if v in ("shipped", "train"):
        return None
    why = text_problem(v, what)
    if why:
        return why
    from tokenizers import Tokenizer
    try:
        n = Tokenizer.from_file(str(v)).get_vocab_size()
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a file it cannot parse
        return f"not a tokenizers tokenizer.json ({str(e).strip().splitlines()[0] if str(e).strip() else e!r}); " \
               f"expected {what}"
    if n > 65535:
        return f"a vocabulary of {n} tokens; expected {what} of at most 65535 tokens (the corpus cache is uint16)"
    return None


@register("pipeline")
class TrainPipeline(Component):
    """Train the `model` group's preset from a seeded random init on a local text corpus."""
    kind: Literal["train"] = "train"
    data: list[str] = Field(default_factory=list, description="text files/folders to train on; empty: "
                            "the Python standard library's .py sources (split by document hash)")
    tokenizer: str = Field("shipped", description="shipped: synodic/assets/corpus/tokenizer.json; train: "
                           "fit a byte-level BPE of vocab_size on the train documents; or a tokenizer.json")
    vocab_size: int = Field(4096, ge=260, description="BPE vocabulary when tokenizer=train")
    seq_len: int = Field(2048, ge=8, description="tokens per packed training sequence")
    batch_size: int | None = Field(None, ge=1, description="sequences per optimiser step; null: "
                                   f"{GPU_BATCH} on a GPU, {CPU_BATCH} on the CPU (fits 24 GiB at seq_len 2048)")
    max_steps: int | None = Field(None, ge=1, description="optimiser steps; null: as many as fit in "
                                  "time_budget_s (measured during warm-up, then fixed and recorded)")
    time_budget_s: float = Field(450.0, gt=0, description="wall-clock budget when max_steps is null "
                                 "(then also a hard stop); ignored when max_steps is set")
    warmup_steps: int = Field(100, ge=0, description="linear LR warm-up steps")
    lr: float = Field(2e-3, gt=0, description="peak learning rate (AdamW)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor as a fraction of lr")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay on matrices (not on norms/SSM vectors)")
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = Field(
        (0.9, 0.95), description="AdamW betas (each in [0, 1))")
    grad_clip: float = Field(1.0, gt=0, description="max global gradient norm")
    eval_every: int = Field(200, ge=1, description="held-out evaluation every this many steps")
    eval_tokens: int = Field(65536, ge=16, description="held-out tokens scored at each periodic eval")
    ckpt_every: int = Field(500, ge=1, description="checkpoint (model, optimiser, data position, RNG) every")
    log_every: int = Field(10, ge=1, description="loss/throughput logging interval in steps")
    seed: int = Field(0, description="seed of the init and of the data order")
    device: Literal["auto", "cuda", "cpu"] = Field("auto", description="training device")
    precision: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 autocast on the "
                                                        "GPU, fp32 on the CPU")
    save_dtype: Literal["bf16", "fp32"] = Field("bf16", description="exported weights: bf16 matrices "
                                                 "(vectors stay fp32) or all fp32")
    scan_chunk: int | None = Field(128, ge=1, description="SSD / delta-rule chunk length for training "
                                   "(null: the config's chunk_size)")
    resume: bool = Field(True, description="continue from run_dir/checkpoint if it exists")
    halt_at_step: int | None = Field(None, ge=1, description="stop (after checkpointing) at this step, "
                                     "as an interruption would; resume continues the same schedule")
    final_eval: bool = Field(True, description="score the whole held-out shard at the end (bits/byte)")
    export_to: str | None = Field(None, description="also write the trained model (config, safetensors, "
                                  "tokenizer) to this folder, e.g. synodic/assets/models/tiny_mamba2")

    @field_validator("data")
    @classmethod
    def _data(cls, v: list[str]) -> list[str]:
        from synodic.config.files import data_problems
        bad = data_problems(v)
        if bad:
            raise ValueError("; ".join(bad))
        return v

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str) -> str:
        why = tokenizer_problem(v)
        if why:
            raise ValueError(why)
        return v

    @field_validator("export_to")
    @classmethod
    def _export_to(cls, v: str | None) -> str | None:
        from synodic.config.files import writable_dir_or_none
        return writable_dir_or_none(v)
