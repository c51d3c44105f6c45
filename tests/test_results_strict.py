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


def test_table_markdown_leaves_columns_equal_in_every_row_to_the_csv(tmp_path):
    import csv

    from synodic.results.tables import write_table_files
    rows = [{"arm": "a", "tok": 1.0, "same": 7, "blank": None, "varies": 1},
            {"arm": "b", "tok": 2.0, "same": 7, "varies": 2}]
    write_table_files(tmp_path, "t", rows, first=["arm", "tok"], metric="tok", label="arm", title="t", plot=False)
    md = (tmp_path / "t.md").read_text()
    header = md.splitlines()[2]
    assert "varies" in header and "same" not in header and "blank" not in header
    assert "2 columns equal in every row are in t.csv only" in md
    with open(tmp_path / "t.csv") as f:
        assert set(next(csv.reader(f))) == {"arm", "tok", "same", "blank", "varies"}
