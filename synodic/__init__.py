"""synodic: an ML-systems framework for LLM decoding."""
import os as _os

# `kernels/` and `pipelines/` beside this package are installed as `synodic.kernels` /
# `synodic.pipelines` (setup.py). When the source checkout itself is on sys.path (python run.py
# from the repo root, PYTHONPATH=repo) the package is found here first, so map them the same way.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "kernels", "__init__.py")) and _root not in __path__:
    __path__.append(_root)
