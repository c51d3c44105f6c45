"""The option files in conf/: each names its class (`kind:` = file name) and lists every field, so that
`group.key=value` overrides need no `+`; a value there equals the class default unless it is one of the
option's intended settings below (otherwise the YAML and the documented default silently disagree)."""
from pathlib import Path

import pytest
import yaml

from synodic.config.components import load_all
from synodic.config.registry import REGISTRIES

CONF = Path(__file__).resolve().parents[1] / "conf"

# (group, option) -> the fields whose YAML value is meant to differ from the class default
INTENDED = {
    ("model", "dsa_mla_7b"): {"dtype"}, ("model", "nemotron_h_8b"): {"dtype"},
    ("model", "qwen35_gdn_4b"): {"dtype"},
    ("workload", "long"): {"num_requests", "prompt_len", "output_len", "concurrency"},
    ("pipeline", "bench"): {"measured_rates"},  # measured data, kept out of code (the YAML cites its source)
    **{("quant", f): {"mode"} for f in ("int4_g64", "mxfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3",
                                        "mxfp8_e5m2", "mxint8", "nvfp4")},
}

load_all()
FILES = sorted((g, f) for g in REGISTRIES for f in (CONF / g).glob("*.yaml"))


@pytest.mark.parametrize("group,path", FILES, ids=[f"{g}/{p.stem}" for g, p in FILES])
def test_option_file_matches_its_class(group, path):
    d = yaml.safe_load(path.read_text()) or {}
    assert d.get("kind") == path.stem
    cls = REGISTRIES[group].classes[path.stem]
    assert set(d) == set(cls.model_fields), "every field listed, nothing else"
    ours, defaults = cls(**d).model_dump(), cls(kind=path.stem).model_dump()
    differ = {k for k in ours if ours[k] != defaults[k]}
    assert differ == INTENDED.get((group, path.stem), set())


def test_every_registered_option_has_a_file():
    for group, reg in REGISTRIES.items():
        assert {p.stem for p in (CONF / group).glob("*.yaml")} == set(reg.kinds()), group
