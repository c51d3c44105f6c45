"""Greedy / temperature / top-p sampling with one generator per request, so a request's tokens do not
depend on what else is in its batch."""
import torch

from .request import Request


class Sampler:
    def __init__(self):
        self._gens: dict[int, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[int]:
        """logits [B, V] (rows in reqs order) → one token per request; one host sync per step."""
        greedy = logits.argmax(-1)
        if all(r.params.temperature == 0 for r in reqs):
            return greedy.tolist()
        out = greedy.tolist()
        for i, r in enumerate(reqs):
            p = r.params
            if p.temperature == 0:
                continue
            gen = self._gens.get(r.id)
            if gen is None:
                gen = self._gens[r.id] = torch.Generator(device="cpu").manual_seed(p.seed)
            probs = torch.softmax(logits[i].float().cpu() / p.temperature, -1)
            if p.top_p < 1.0:
                sp, idx = probs.sort(descending=True)
                keep = sp.cumsum(-1) - sp < p.top_p  # smallest prefix with mass >= top_p
                probs = torch.zeros_like(probs).scatter_(0, idx[keep], sp[keep])
            out[i] = int(torch.multinomial(probs, 1, generator=gen))
        return out

    def forget(self, req_id: int) -> None:
        self._gens.pop(req_id, None)
