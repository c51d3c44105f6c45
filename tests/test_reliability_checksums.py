"""A damaged quantization artifact or store part is found by its sha256, not trusted: a flipped byte,
a truncated file or a lost file is one ConfigError line naming the file (exit 2 through run.py), never a
traceback or silently different weights."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synodic.pipelines.quantize import quantize_to_store

from synodic.config import ConfigError
from synodic.models.presets import PRESETS
from synodic.models.weights import random_model
from synodic.quant import store
from synodic.quant.apply import apply_quant
from synodic.quant.config import BlockQuant

ROOT = Path(__file__).resolve().parents[1]
Q = BlockQuant(kind="mxfp4", method="rtn", layers=["blocks.0.*", "blocks.1.*"])  # 2 groups, rtn: fast


def tiny():
    return random_model(PRESETS["tiny_mamba2"], 0)


def flip(path: Path, at: float = 0.5) -> None:
    b = bytearray(path.read_bytes())
    b[int(len(b) * at)] ^= 0xFF
    path.write_bytes(bytes(b))


def truncate(path: Path) -> None:
    b = path.read_bytes()
    path.write_bytes(b[: len(b) // 2])


@pytest.fixture
def artifact(tmp_path):
    res = quantize_to_store(tiny(), Q, tmp_path, executor="inline", progress=False)
    return Path(res["artifact"])


def one_line(e: pytest.ExceptionInfo, name: str) -> str:
    assert len(e.value.lines) == 1
    line = e.value.lines[0]
    assert name in line and "damaged" in line and "\n" not in line
    return line


def test_manifest_records_the_checkpoint_sha256(artifact):
    man = json.loads((artifact / store.MANIFEST).read_text())
    assert man["checksums"][store.CKPT] == store.sha256(artifact / store.CKPT)
    assert not (artifact / store.PARTS).exists()  # parts and their checksum files are dropped after the merge
    apply_quant(tiny(), Q.model_copy(update={"artifact": str(artifact)}))  # intact: loads


@pytest.mark.parametrize("damage", [flip, truncate, lambda p: flip(p, 0.999), lambda p: p.unlink()],
                         ids=["flip_middle", "truncate", "flip_last_byte", "delete"])
def test_damaged_checkpoint_is_refused_naming_it(artifact, damage):
    damage(artifact / store.CKPT)
    for how in (str(artifact), str(artifact.parent)):  # the artifact dir, or the store root holding it
        with pytest.raises(ConfigError) as e:
            apply_quant(tiny(), Q.model_copy(update={"artifact": how}))
        one_line(e, store.CKPT)
    with pytest.raises(ConfigError) as e:  # pipeline=quantize does not call it complete either
        quantize_to_store(tiny(), Q, artifact.parent, executor="inline", progress=False)
    one_line(e, store.CKPT)
    res = quantize_to_store(tiny(), Q, artifact.parent, executor="inline", progress=False, overwrite=True)
    assert not res["already_complete"] and store.verify_artifact(artifact)


def test_auto_store_damage_is_not_a_silent_requantize(artifact, monkeypatch):
    monkeypatch.setenv("SYNODIC_QUANT_STORE", str(artifact.parent))
    assert apply_quant(tiny(), Q).source == "artifact"
    flip(artifact / store.CKPT)
    with pytest.raises(ConfigError) as e:
        apply_quant(tiny(), Q)
    one_line(e, store.CKPT)


def test_garbage_manifest_is_one_line(artifact):
    (artifact / store.MANIFEST).write_bytes(b"\xff\xfe{not json")
    with pytest.raises(ConfigError) as e:
        apply_quant(tiny(), Q.model_copy(update={"artifact": str(artifact)}))
    one_line(e, store.MANIFEST)


def test_artifact_without_checksum_loads_with_a_warning(artifact, caplog):
    man = json.loads((artifact / store.MANIFEST).read_text())
    del man["checksums"]
    (artifact / store.MANIFEST).write_text(json.dumps(man))
    with caplog.at_level("WARNING"):
        assert apply_quant(tiny(), Q.model_copy(update={"artifact": str(artifact)})).source == "artifact"
    assert "no checksum" in caplog.text
    truncate(artifact / store.CKPT)  # nothing to check it against, yet still one line
    with pytest.raises(ConfigError) as e:
        apply_quant(tiny(), Q.model_copy(update={"artifact": str(artifact)}))
    one_line(e, store.CKPT)


class Killed(Exception):
    pass


def killed_after_first(tmp_path) -> Path:
    def die(group, stats):
        raise Killed
    with pytest.raises(Killed):
        quantize_to_store(tiny(), Q, tmp_path, executor="inline", progress=False, on_group_done=die)
    (adir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    part = store.part_path(adir, "blocks.0")
    assert part.is_file() and part.with_name(part.name + store.SUM).is_file()
    return part


@pytest.mark.parametrize("damage", [flip, truncate], ids=["flip", "truncate"])
def test_damaged_part_is_refused_on_resume(tmp_path, damage):
    part = killed_after_first(tmp_path)
    damage(part)
    with pytest.raises(ConfigError) as e:
        quantize_to_store(tiny(), Q, tmp_path, executor="inline", progress=False)
    one_line(e, part.name)


def test_deleted_part_or_its_checksum_is_solved_again(tmp_path):
    part = killed_after_first(tmp_path)
    part.with_name(part.name + store.SUM).unlink()  # cut off between the part and its checksum: unfinished
    res = quantize_to_store(tiny(), Q, tmp_path, executor="inline", progress=False)
    assert (res["computed_groups"], res["resumed_groups"]) == (2, 0)
    part = killed_after_first(tmp_path / "again")
    part.unlink()  # a lost part: its group is solved again, its stale checksum replaced
    res = quantize_to_store(tiny(), Q, tmp_path / "again", executor="inline", progress=False)
    assert (res["computed_groups"], res["resumed_groups"]) == (2, 0)
    assert store.verify_artifact(res["artifact"])


def test_run_py_exits_2_with_one_line(tmp_path):
    from synodic.pipelines.quantize import run

    from synodic.config.compose import compose
    q = ["quant=mxfp4", "quant.method=rtn", "quant.layers=[blocks.1.*]", "runtime.device=cpu"]
    out = run(compose(["pipeline=quantize", "pipeline.executor=inline", f"pipeline.store={tmp_path}", *q]),
              tmp_path)
    flip(Path(out["artifact"]) / store.CKPT)
    p = subprocess.run([sys.executable, str(ROOT / "run.py"), "pipeline=eval", *q, f"quant.artifact={tmp_path}",
                        "pipeline.max_tokens=64", "pipeline.seq_len=32", f"hydra.run.dir={tmp_path / 'run'}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 2, p.stderr[-2000:]
    errs = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errs) == 1 and store.CKPT in errs[0] and "Traceback" not in p.stderr
