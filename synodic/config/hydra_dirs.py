"""A rerun in a run directory that already has Hydra's `.hydra/` files keeps them until it succeeds.

Hydra writes `.hydra/{config,hydra,overrides}.yaml` when a job starts, before any validation. A rerun
in a directory whose results.json (or whose still-running job) those files describe would replace them
even when the rerun then fails, leaving results.json beside the config of a run that never produced
it. So when `.hydra/` is already there, the Hydra callback below turns Hydra's own write off for this
run (output_subdir=null), and `commit()` writes the three files after results.json is written: a
failed or killed rerun leaves the originals untouched. A fresh directory gets Hydra's usual write at
job start. Registered in conf/config.yaml under hydra.callbacks.
"""
from __future__ import annotations

import os
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf, open_dict, read_write

_deferred: str | None = None  # the output_subdir whose write this run postponed


class DeferConfigFiles(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        global _deferred
        _deferred = None
        sub = config.hydra.output_subdir
        if sub is None:
            return
        run_dir = Path(str(OmegaConf.select(config, "hydra.run.dir")))  # ${now:} is cached: the job's dir
        if (run_dir / str(sub)).is_dir():
            _deferred = str(sub)
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.output_subdir = None


def commit(run_dir: Path, task_cfg) -> None:
    """After a successful run: write the config files Hydra was kept from writing at job start (the
    same three files, with output_subdir as it was asked for)."""
    global _deferred
    if _deferred is None:
        return
    from hydra.core.hydra_config import HydraConfig
    # a plain copy (Hydra's node is read-only): interpolations stay unresolved, as in Hydra's own write
    hcfg = OmegaConf.create(OmegaConf.to_container(HydraConfig.instance().cfg, resolve=False))
    hcfg.hydra.output_subdir = _deferred
    out = Path(run_dir) / _deferred
    out.mkdir(parents=True, exist_ok=True)
    for name, node in (("config.yaml", task_cfg), ("hydra.yaml", hcfg),
                       ("overrides.yaml", hcfg.hydra.overrides.task)):
        tmp = out / f".{name}.tmp{os.getpid()}"  # temp + rename: a kill never leaves half a file
        tmp.write_text(OmegaConf.to_yaml(node))
        os.replace(tmp, out / name)
    _deferred = None
