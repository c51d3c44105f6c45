"""Package list for the `kernels/` and `pipelines/` folders mapped under `synodic` (see pyproject)."""
from setuptools import find_packages, setup

packages = find_packages(include=["synodic", "synodic.*"])
for folder in ("kernels", "pipelines"):
    packages += [f"synodic.{folder}"] + [f"synodic.{folder}.{p}" for p in find_packages(folder)]
setup(packages=packages)
