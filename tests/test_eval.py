"""Held-out metrics of the shipped models are stable to the digits reported; the comparison metrics
behave; pipeline=eval writes its metrics."""
import math

import pytest
import torch

from synodic.data.corpus import load_heldout
from synodic.data.tokenizer import load_tokenizer
from synodic.evaluation.metrics import bits_per_byte, compare, heldout_metrics, nll, token_stream
from synodic.models.weights import load_checkpoint, shipped_dir

# bits/byte on the first 4096 predicted tokens of the shipped shard (13,532 bytes), fp32 on the CPU.
# The whole shard (README): tiny_mamba2 0.7588, tiny_gdn 0.8008; xz -9 gets 1.3718 on it.
PREFIX_BPB = {"tiny_mamba2": 1.26965, "tiny_gdn": 1.32844}


@pytest.fixture(scope="module")
def heldout():
    return load_heldout()


@pytest.mark.parametrize("preset", ["tiny_mamba2", "tiny_gdn"])
def test_shipped_model_bits_per_byte(preset, heldout):
    d = shipped_dir(preset)
    assert d is not None, f"no shipped checkpoint for {preset}"
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (d / f).stat().st_size <= 16 * 2 ** 20
    tok, model = load_tokenizer(d), load_checkpoint(d).eval()
    stream = token_stream(tok, heldout)[:4097]
    n_bytes = sum(tok.token_bytes()[i] for i in stream[1:].tolist())
    total, count = nll(model, stream, 2048, 2)
    assert count == 4096 and n_bytes == 13532
    assert bits_per_byte(total, n_bytes) == pytest.approx(PREFIX_BPB[preset], abs=1e-4)


def test_bits_per_byte_counts_every_byte():
    """A uniform scorer over V tokens costs log2(V) bits per token: bits/byte = tokens·log2 V / bytes."""
    tok = load_tokenizer()
    text = "def f(x):\n    return x\n" * 20

    def uniform(ids):
        return torch.zeros(*ids.shape, tok.vocab_size)
    m = heldout_metrics(uniform, tok, text, seq_len=16)
    assert m["tokens"] == len(tok.encode(text)) and m["bytes"] == len(text.encode())
    assert m["bits_per_byte"] == pytest.approx(m["tokens"] * 12 / m["bytes"])
    assert m["perplexity"] == pytest.approx(4096, rel=1e-5)


def test_compare_metrics(heldout):
    d = shipped_dir("tiny_gdn")
    tok, model = load_tokenizer(d), load_checkpoint(d).eval()
    stream = token_stream(tok, heldout)[:2049]
    same = compare(model, model, stream, seq_len=2048)
    assert same["kl_mean"] == pytest.approx(0, abs=1e-6) and same["top1_agreement"] == 1.0
    assert same["positions"] == 2048

    def noisy(ids):
        return model(ids) + 0.5 * torch.randn(*ids.shape, tok.vocab_size, generator=torch.Generator().manual_seed(0))
    c = compare(noisy, model, stream, seq_len=2048)
    assert 0 < c["kl_mean"] < c["kl_p95"] and 0.5 < c["top1_agreement"] < 1.0 and c["dlogprob_p95"] > 0.1
    with pytest.raises(ValueError):
        compare(model, model, stream[:100], seq_len=2048)

    def drifting(ids):  # noise growing along the window: the quarters must show it
        ramp = torch.linspace(0, 1, ids.shape[1])[None, :, None]
        return model(ids) + ramp * torch.randn(*ids.shape, tok.vocab_size, generator=torch.Generator().manual_seed(0))
    c = compare(drifting, model, stream, seq_len=2048)
    q = c["kl_mean_by_quarter"]
    assert len(q) == 4 and q[0] < q[1] < q[2] < q[3] and sum(q) / 4 == pytest.approx(c["kl_mean"])


def test_decay_scale_lengthens_memory_in_scored_and_reference_models():
    from synodic.pipelines.eval import scale_decay
    d = shipped_dir("tiny_mamba2")
    model = load_checkpoint(d).eval()
    m = model.ssm_layers[0]
    with torch.no_grad():
        before = m.A().clone()  # cached per parameter version: the in-place shift must invalidate it
        scale_decay(model, 0.01)
        assert torch.allclose(m.A(), before * 0.01, rtol=1e-5)
    from synodic.config import ConfigError
    from synodic.config.compose import compose
    with pytest.raises(ConfigError, match="pipeline.decay_scale=0"):
        compose(["pipeline=eval", "pipeline.decay_scale=0"])


def test_eval_pipeline_with_reference(tmp_path):
    from synodic.pipelines import eval as ev

    from synodic.config import ConfigError
    from synodic.config.compose import compose
    cfg = compose(["pipeline=eval", "runtime.device=cpu", "pipeline.max_tokens=2048",
                   "pipeline.reference={model: {dtype: bfloat16}}"])
    out = ev.run(cfg, tmp_path)
    m = out["metrics"]
    assert m["bits_per_byte"] == pytest.approx(1.4911, abs=1e-3)   # first 2048 tokens, tiny_mamba2
    assert math.isfinite(m["bits_per_byte_reference"]) and abs(m["bits_per_byte_reference"] - m["bits_per_byte"]) < 0.05
    assert 0 < m["kl_mean"] < 0.05 and m["top1_agreement"] > 0.9 and m["compared_positions"] == 2048
    assert out["reference"] == {"model": {**cfg.model.model_dump(mode="json"), "dtype": "bfloat16"}}
    assert out["path"] == "forward" and out["not_exercised"] == []
    with pytest.raises(ConfigError, match="pipeline.seq_len=512 with a reference"):
        compose(["pipeline=eval", "pipeline.seq_len=512", "pipeline.reference={quant: {kind: none}}"])


def test_decode_path_scorer_matches_forward_and_exercises_the_backend():
    """The decode-path scorer gives the forward pass's logits for ssm=eager, and replay in fp32
    agrees to 1e-4 while a single fp8 checkpoint drifts measurably."""
    import torch

    from synodic.config.compose import compose
    from synodic.engine.teacher import DecodePathScorer
    from synodic.graph import build_graph

    x = torch.randint(0, 4096, (2, 40), generator=torch.Generator().manual_seed(0))
    outs = {}
    for name, ov in [("eager", []), ("replay", ["ssm=replay", "ssm.ring_len=8", "ssm.precision=fp32"]),
                     ("fp8", ["ssm=replay", "ssm.ring_len=8", "ssm.precision=single_fp8"])]:
        g = build_graph(compose(["runtime.device=cpu", *ov]), max_seq_len=48, max_slots=2)
        outs[name] = DecodePathScorer(g)(x)
        if name == "eager":
            fwd = g.model(x).float()
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    assert rel(outs["eager"], fwd) < 1e-4
    assert rel(outs["replay"], outs["eager"]) < 1e-4
    assert rel(outs["fp8"], outs["eager"]) > 1e-4


def test_quant_grid_tables_kl_and_layer_errors(tmp_path):
    from synodic.pipelines import eval as ev

    from synodic.config.compose import compose

    cfg = compose(["pipeline=eval", "runtime.device=cpu", "pipeline.max_tokens=2048",
                   "pipeline.quant_grid=[mxfp8_e4m3:rtn,mxfp4:rtn]"])
    rows = ev.run(cfg, tmp_path)["quant_grid"]
    by = {r["scheme"]: r for r in rows}
    # 8-bit weights are far closer to the unquantized model than 4-bit ones
    assert 0 < by["mxfp8_e4m3:rtn"]["kl_mean"] < by["mxfp4:rtn"]["kl_mean"] < 0.5
    assert by["mxfp8_e4m3:rtn"]["weight_rel_mse_mean"] < by["mxfp4:rtn"]["weight_rel_mse_mean"]
    for f in ("quant_grid.md", "quant_grid.csv", "quant_grid.png", "quant_layer_error.png"):
        assert (tmp_path / f).is_file()


def test_eval_forward_names_the_options_it_does_not_run(tmp_path, capsys):
    from synodic.pipelines import eval as ev

    from synodic.config.compose import compose
    cfg = compose(["pipeline=eval", "runtime.device=cpu", "pipeline.max_tokens=64", "pipeline.seq_len=32",
                   "ssm=replay", "kv=adaptive"])
    out = ev.run(cfg, tmp_path)
    assert out["not_exercised"] == ["ssm=replay", "kv=adaptive"]
    assert "ssm=replay, kv=adaptive with pipeline.path=forward" in capsys.readouterr().err
