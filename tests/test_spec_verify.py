"""The verification path before draft models exist: synthetic drafts (the target's own greedy
continuation, corrupted at chosen positions) must reproduce plain greedy decoding exactly, with the
expected acceptance, for each state backend that can roll back."""
import pytest

from synodic.config.compose import compose
from synodic.engine.engine import Engine
from synodic.engine.request import Request, SamplingParams
from synodic.graph import build_graph

PROMPTS = [[5, 9, 200, 31, 7], [100, 3], [42] * 9]
GAMMA = 3


def _engine(overrides, window=1):
    cfg = compose(["runtime.device=cpu", "ssm.ring_len=8", *overrides] if "ssm=replay" in overrides
                  else ["runtime.device=cpu", *overrides])
    return Engine(build_graph(cfg, max_seq_len=80, window=window))


def _reqs(n):
    return [Request(i, p, SamplingParams(max_tokens=n)) for i, p in enumerate(PROMPTS)]


def oracle_drafter(reference, reject_every):
    """Drafts = the reference greedy continuation; the draft at every `reject_every`-th output index
    is corrupted, forcing a rejection there (and repeated rejections over consecutive steps)."""
    def draft(batch):
        out = []
        for r in batch:
            ref, n = reference[r.id], len(r.output_ids)
            d = []
            for j in range(GAMMA):
                idx = n + j
                tok = ref[idx] if idx < len(ref) else 0
                d.append((tok + 1) % 4096 if idx % reject_every == 0 else tok)
            out.append(d)
        return out
    return draft


@pytest.mark.parametrize("preset", ["tiny_mamba2", "tiny_gdn"])
@pytest.mark.parametrize("ssm", ["ssm=replay", "ssm=eager"])
def test_synthetic_drafts_reproduce_greedy(preset, ssm):
    plain = _reqs(30)
    _engine([f"model={preset}"]).generate(plain)
    reference = {r.id: r.output_ids for r in plain}
    for reject_every in (5, 2):
        reqs = _reqs(30)
        eng = _engine([f"model={preset}", ssm], window=GAMMA + 1)
        eng.generate(reqs, drafter=oracle_drafter(reference, reject_every))
        assert [r.output_ids for r in reqs] == [reference[r.id] for r in reqs]
        mean_acc = sum(eng.accepted) / len(eng.accepted)
        assert 1.0 < mean_acc <= GAMMA + 1
