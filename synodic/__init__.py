"""synodic: an ML-systems framework for LLM decoding."""
import os as _os

# `kernels/`, `pipelines/` and `conf/` beside this package are installed as `synodic.kernels`,
# `synodic.pipelines`, `synodic.conf` (pyproject's package-dir). A checkout used without installing
# (PYTHONPATH=repo, as on a machine that only has the sources) finds the package here first, so map
# them the same way; only a checkout (run.py beside kernels/), never an installed package's parent.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (_os.path.isfile(_os.path.join(_root, "kernels", "__init__.py"))
        and _os.path.isfile(_os.path.join(_root, "run.py")) and _root not in __path__):
    __path__.append(_root)
