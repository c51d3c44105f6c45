"""Imports every module that registers config components, so each group's registry is complete."""
import importlib
import pkgutil

MODULES = ["synodic.models.choice", "synodic.ssm.config", "synodic.kv.config", "synodic.spec.config",
           "synodic.quant.config", "synodic.engine.workload", "synodic.engine.config"]


def load_all() -> None:
    for m in MODULES:
        importlib.import_module(m)
    # Pipelines register themselves; each module in synodic.pipelines keeps heavy imports in run().
    import synodic.pipelines as pkg
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{info.name}")
