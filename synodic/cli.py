"""The `synodic` command (and `python run.py`): Hydra composes the groups, then `execute` validates,
runs the pipeline and writes results.json. Bad input exits with code 2 and one line per problem;
SYNODIC_TRACEBACK=1 shows the traceback."""
import importlib
import logging
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from synodic.config import ConfigError, validate
from synodic.config.errors import PartialResults
from synodic.config.logs import FILE_ONLY

log = logging.getLogger(__name__)


def execute(dcfg) -> int:
    try:
        return _execute(dcfg)
    except KeyboardInterrupt:  # Ctrl-C: one line, not the traceback of wherever the run was
        if os.environ.get("SYNODIC_TRACEBACK"):
            raise
        line = ("interrupted (Ctrl-C) before this run's results.json was written; what it had finished "
                "(checkpoints, quantized parts, an earlier run's results) is kept")
        print(f"error: {line}", file=sys.stderr)
        log.error(line, extra=FILE_ONLY)
        return 130


def _execute(dcfg) -> int:
    try:
        raw = OmegaConf.to_container(dcfg, resolve=True)
        raw.pop("hydra", None)
        cfg = validate(raw)
        from synodic.config.files import architecture_note
        architecture_note(cfg.model)  # model=X naming a checkpoint of another architecture: say which runs
        from hydra.core.hydra_config import HydraConfig
        hc = HydraConfig.get()
        run_dir = Path(hc.runtime.output_dir)
        choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
        from synodic.graph import resolve_device
        device = resolve_device(cfg.runtime)
        from synodic.config.budget import check_fits
        check_fits(cfg, device)  # refuse up front what cannot fit, naming the key
        mod = importlib.import_module(f"synodic.pipelines.{cfg.pipeline.kind}")
        from synodic.results.locks import exclusive
        with exclusive(run_dir / ".synodic.lock", "hydra.run.dir", run_dir):  # one run per directory
            try:
                payload = mod.run(cfg, run_dir)
            except PartialResults as e:  # the pipeline stopped part-way: keep what finished, then report why
                dest = Path(e.dest or run_dir)  # (beside an earlier complete run's results: results.partial_dir)
                _write(dest, cfg, choices, e.payload, device, dcfg if dest == run_dir else None)
                if isinstance(e.cause, ConfigError) or os.environ.get("SYNODIC_TRACEBACK"):
                    raise e.cause from None
                # a crash: one line on the terminal (exit 1), the traceback in run.log beside the kept results
                log.error("stopped part-way", exc_info=e.cause, extra=FILE_ONLY)
                print(f"error: {_crash_line(e)} (traceback in {run_dir / 'run.log'}; what finished before it is in "
                      f"{dest / 'results.json'})", file=sys.stderr)
                return 1
    except ConfigError as e:
        if os.environ.get("SYNODIC_TRACEBACK"):
            raise
        for line in e.lines:
            print(f"error: {line}", file=sys.stderr)
            log.error(line, extra=FILE_ONLY)
        return 2
    _write(run_dir, cfg, choices, payload, device, dcfg)
    return 0


def _crash_line(e: PartialResults) -> str:
    msg = str(e.cause).strip()
    return (f"{e.where}: " if e.where else "") + type(e.cause).__name__ + (f": {msg.splitlines()[0]}" if msg else "")


def _write(run_dir, cfg, choices, payload, device, dcfg) -> None:
    from synodic.results.writer import write_results
    path = write_results(run_dir, cfg, choices, payload, device)
    if dcfg is not None:  # (None: a failed rerun's partial results, written beside the earlier run's)
        from synodic.config.hydra_dirs import commit
        commit(run_dir, dcfg)  # a rerun's .hydra/ files replace the old ones only now that its results.json exists
    print(f"results: {path}")
    log.info("results: %s", path)


def _job(cfg) -> None:
    code = execute(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    """Console-script entry: the same overrides as `python run.py`, from any directory."""
    import hydra

    from synodic.config.hydra_errors import guard
    from synodic.config.multirun import check_multirun
    guard()  # Hydra's own errors and --help: one line each, exit 2
    try:
        check_multirun(sys.argv[1:])
    except ConfigError as e:
        for line in e.lines:
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    hydra.main(config_path="pkg://synodic.conf", config_name="config", version_base="1.3")(_job)()
