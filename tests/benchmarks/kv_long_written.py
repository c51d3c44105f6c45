"""A check shared by the kv_long family's smoke tests (test_kv_long, test_kv_long_spec): what a run wrote."""
import json


def assert_written(res: dict, out, cells) -> None:
    """out (the JSON) holds res's rows; the .md table has a line per (load, policy or variant) in cells; the plot
    is there."""
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(res["rows"], default=str))
    md = out.with_suffix(".md").read_text()
    for ld, name in cells:
        assert f"| {ld} | {name} |" in md
    assert out.with_suffix(".png").stat().st_size > 0
