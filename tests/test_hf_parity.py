"""Hugging Face folders written by transformers' own NemotronH (dense, and with MoE layers) / Qwen3-Next /
Qwen3.5 (text) classes load into synodic and compute the same thing: whole-sequence logits (fp32, relative
max error <= 1e-4), each decode step against transformers' cached forward, and 32 greedy tokens token for
token, with ssm=eager and ssm=replay. Runs on the CPU; transformers takes its torch fallbacks (no mamba_ssm /
fla kernels)."""
import pytest
import torch

pytest.importorskip("transformers")

from hf_folders import write_folder  # noqa: E402

from synodic.config.compose import compose  # noqa: E402
from synodic.engine.engine import Engine  # noqa: E402
from synodic.engine.request import Request, SamplingParams  # noqa: E402
from synodic.graph import build_graph  # noqa: E402
from synodic.models.weights import load_checkpoint  # noqa: E402

FAMILIES = ["nemotron_h", "nemotron_h_moe", "qwen3_next", "qwen3_5"]
PROMPT = [5, 9, 200, 31, 7, 250, 3, 18, 101, 64, 12]


def rel(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(fam)
        out[fam] = (d, write_folder(fam, d))
    return out


@pytest.mark.parametrize("fam", FAMILIES)
def test_folder_is_sharded_and_prefill_logits_match(folders, fam):
    d, ref = folders[fam]
    assert len(list(d.glob("model-*.safetensors"))) > 3 and (d / "model.safetensors.index.json").is_file()
    model = load_checkpoint(d, progress=False)
    ids = torch.randint(0, ref.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = ref(ids).logits, model(ids)
    assert rel(got, want) <= 1e-4
    # the comparison can fail: one mixer parameter off by a little moves the logits past the bound
    with torch.no_grad():
        model.ssm_layers[0].A_log.add_(0.5)
        assert rel(model(ids), want) > 1e-4


def _hf_steps(ref, prompt, steps):
    """transformers' cached forward: the prompt, then one greedy token at a time; logits of every step."""
    with torch.no_grad():
        out = ref(torch.tensor([prompt]), use_cache=True)
        logits, cache = [out.logits[0, -1]], out.cache
        for _ in range(steps):
            tok = logits[-1].argmax().view(1, 1)
            out = ref(tok, cache=cache, use_cache=True)
            logits.append(out.logits[0, -1])
            cache = out.cache
    return logits


@pytest.mark.parametrize("ssm", ["eager", "replay"])
@pytest.mark.parametrize("fam", FAMILIES)
def test_decode_steps_and_greedy_match_transformers(folders, fam, ssm):
    d, ref = folders[fam]
    graph = build_graph(compose(["runtime.device=cpu", f"model.weights={d}", f"ssm={ssm}"]), max_seq_len=64)
    eng = Engine(graph)
    graph.kv.blocks.grow(0, 64)  # the scheduler's page reservation, which runner-level steps bypass
    # step by step: prefill, then 12 decode steps fed transformers' greedy tokens
    want = _hf_steps(ref, PROMPT, 12)
    got = [eng.runner.prefill(0, PROMPT)]
    for i in range(12):
        tok = int(want[i].argmax())
        got.append(eng.runner.decode([0], [len(PROMPT) + i], [tok], max_len=64)[0])
    for w, g in zip(want, got):
        assert rel(g, w) <= 1e-4
    # greedy generation through the engine (fresh slots), 32 tokens
    graph2 = build_graph(compose(["runtime.device=cpu", f"model.weights={d}", f"ssm={ssm}"]), max_seq_len=64)
    reqs = [Request(0, PROMPT, SamplingParams(max_tokens=32)), Request(1, PROMPT[:4], SamplingParams(max_tokens=32))]
    Engine(graph2).generate(reqs)
    ref.generation_config.eos_token_id = None  # run the full 32 tokens, as the engine does without a tokenizer
    for r in reqs:
        with torch.no_grad():
            hf = ref.generate(torch.tensor([r.prompt_ids]), max_new_tokens=32, do_sample=False)
        assert r.output_ids == hf[0, len(r.prompt_ids):].tolist()


def test_qwen3_5_multimodal_wrapper_loads_the_language_model(folders, tmp_path):
    """Hub Qwen3.5 folders are the multimodal model: config under text_config, tensors under
    model.language_model.*, vision tensors beside them (skipped)."""
    import json

    from safetensors.torch import load_file, save_file
    src, ref = folders["qwen3_5"]
    text = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5ForConditionalGeneration"],
                                                      "model_type": "qwen3_5", "text_config": text,
                                                      "tie_word_embeddings": text["tie_word_embeddings"]}))
    tensors = {}
    for shard in src.glob("model-*.safetensors"):
        for k, v in load_file(str(shard)).items():
            tensors[k.replace("model.", "model.language_model.", 1)] = v
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    a, b = load_checkpoint(src, progress=False), load_checkpoint(tmp_path, progress=False)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_tokenizer_and_eos(folders, tmp_path):
    """tokenizer.json through `tokenizers`; EOS from generation_config.json, else tokenizer_config.json."""
    import json
    import shutil

    from hf_folders import write_tokenizer

    from synodic.engine.text import load_codec
    d = tmp_path / "f"
    shutil.copytree(folders["nemotron_h"][0], d)
    write_tokenizer(d, 320)
    codec = load_codec(d)
    assert codec.eos_id == 2 and codec.tok.token_to_id("</s>") == 2  # generation_config.json: eos_token_id 2
    assert codec.decode(codec.encode("hello world")) == "hello world"
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    assert load_codec(d).eos_id == 1
    (d / "generation_config.json").unlink()
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("eos_token_id")
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<unk>"}))
    assert load_codec(d).eos_id == 0
