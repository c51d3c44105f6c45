"""Package list for the top-level folders mapped under `synodic` (see pyproject's package-dir)."""
from setuptools import find_packages, setup

packages = find_packages(include=["synodic", "synodic.*"])
for folder in ("kernels", "pipelines"):
    packages += [f"synodic.{folder}"] + [f"synodic.{folder}.{p}" for p in find_packages(folder)]
packages.append("synodic.conf")  # YAML only below it (package data); conf/__init__.py marks it
setup(packages=packages)
