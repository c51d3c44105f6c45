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
            gen = self.generator(r)
            probs = torch.softmax(logits[i].float().cpu() / p.temperature, -1)
            if p.top_p < 1.0:
                sp, idx = probs.sort(descending=True)
                keep = sp.cumsum(-1) - sp < p.top_p  # smallest prefix with mass >= top_p
                probs = torch.zeros_like(probs).scatter_(0, idx[keep], sp[keep])
            out[i] = int(torch.multinomial(probs, 1, generator=gen))
        return out

    def generator(self, r: Request) -> torch.Generator:
        """The request's own host generator (seeded by its params), shared by plain and speculative steps."""
        gen = self._gens.get(r.id)
        if gen is None:
            gen = self._gens[r.id] = torch.Generator(device="cpu").manual_seed(r.params.seed)
        return gen

    def uniforms(self, reqs: list[Request], n: int) -> torch.Tensor:
        """[B, n] uniforms in [0, 1), row i from request i's generator (zeros for greedy rows)."""
        return torch.stack([torch.rand(n, generator=self.generator(r)) if r.params.temperature > 0
                            else torch.zeros(n) for r in reqs])

    def forget(self, req_id: int) -> None:
        self._gens.pop(req_id, None)
