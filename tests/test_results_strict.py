"""results.json is strict JSON: inf / nan become null and are listed under non_finite."""
import json

from synodic.config.compose import compose
from synodic.results.writer import write_results


def test_non_finite_values_become_null_and_are_flagged(tmp_path):
    cfg = compose(["runtime.device=cpu"])
    payload = {"metrics": {"ppl": float("inf"), "kl": [1.0, float("nan")], "ok": 2.5}}
    path = write_results(tmp_path, cfg, {}, payload)
    text = path.read_text()
    doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert doc["metrics"] == {"ppl": None, "kl": [1.0, None], "ok": 2.5}
    assert doc["non_finite"] == ["metrics.ppl", "metrics.kl[1]"]
    assert "Infinity" not in text and "NaN" not in text
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
