"""The repo root's folders must not shadow installed packages of the same name (Hugging Face's `kernels`)."""
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_an_installed_kernels_package_wins_over_the_repo_folder(tmp_path, monkeypatch):
    # Stand-in for Hugging Face's `kernels` where site-packages sits on sys.path: anywhere but the very end.
    fake = tmp_path / "kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text("FROM_HUB = True\n")
    monkeypatch.setattr(sys, "path", sys.path[:-1] + [str(tmp_path)] + sys.path[-1:])
    monkeypatch.delitem(sys.modules, "kernels", raising=False)
    importlib.invalidate_caches()
    found = Path(importlib.import_module("kernels").__file__).resolve()
    assert not found.is_relative_to(ROOT / "kernels"), found  # the stand-in, or the real one where it is installed


def test_the_repo_folders_still_import_under_synodic():
    import synodic.kernels.quant_linear as quant_linear

    import benchmarks

    assert Path(quant_linear.__file__).is_relative_to(ROOT / "kernels")
    assert Path(benchmarks.__path__[0]).resolve() == ROOT / "benchmarks"
