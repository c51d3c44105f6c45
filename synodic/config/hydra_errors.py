"""Hydra's own errors in synodic's style: one line per problem naming the override, exit code 2.

Hydra reports an unknown option, a grammar error, a key "not in struct" or a broken `${...}` with a
multi-line message (search path, stack hint) and exit code 1. `guard(argv)` composes the command line
in-process first, with the same config dir and overrides the job will use, and turns every failure —
Hydra's, OmegaConf's and the schema's — into `error: <key>=<value>: <what was expected>` lines. Both
entry points (run.py and the `synodic` console script) call it before handing argv to Hydra's main."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from .compose import CONF_DIR
from .errors import ConfigError
from .registry import GROUPS, REGISTRIES

# Hydra's own flags: they never reach composition of the job config.
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}


def options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(job overrides, Hydra flags)."""
    overrides, flags, it = [], [], iter(argv)
    for a in it:
        if a.startswith("-"):
            flags.append(a)
            if a in _FLAGS_WITH_VALUE:
                flags.append(next(it, ""))
        elif a.startswith("hydra.") or a.startswith("hydra/") or a.lstrip("+~").startswith("hydra"):
            flags.append(a)
        else:
            overrides.append(a)
    return overrides, flags


def _chosen(overrides: list[str]) -> dict[str, str]:
    """Group → option, from conf/config.yaml's defaults and the overrides."""
    import yaml
    out = {}
    for d in yaml.safe_load((CONF_DIR / "config.yaml").read_text()).get("defaults", []):
        if isinstance(d, dict):
            out.update({str(k): str(v) for k, v in d.items()})
    for o in overrides:
        k, _, v = o.partition("=")
        if k in GROUPS:
            out[k] = v
    return out


def _fields(group: str, overrides: list[str]) -> str:
    from .components import load_all
    load_all()
    cls = REGISTRIES[group].classes.get(_chosen(overrides).get(group, ""))
    return ", ".join(sorted(cls.model_fields)) if cls is not None else ""


def _mapping_field(group: str, field: str, overrides: list[str]) -> bool:
    """Whether `group.field` of the chosen option is a mapping (its new keys are added with '+')."""
    import typing
    cls = REGISTRIES[group].classes.get(_chosen(overrides).get(group, ""))
    info = cls.model_fields.get(field) if cls is not None else None
    if info is None:
        return False
    ann = info.annotation
    return any(t is dict or typing.get_origin(t) is dict for t in (ann, *typing.get_args(ann)))


def _first(msg: str) -> str:
    return " ".join(str(msg).strip().splitlines()[0].split()) if str(msg).strip() else type(msg).__name__


def format_hydra_error(exc: BaseException, overrides: list[str]) -> list[str]:
    """One line per problem for an exception raised while Hydra composes or OmegaConf resolves."""
    from hydra.errors import MissingConfigException, OverrideParseException
    overrides = [str(o) for o in overrides]  # a study file's YAML may hold numbers or null
    msg = str(exc)
    if isinstance(exc, MissingConfigException) or "Could not find '" in msg:
        m = re.search(r"Could not find '([^']+)/([^']+)'", msg)
        if m and m.group(1) in GROUPS or (m and (CONF_DIR / m.group(1)).is_dir()):
            g, opt = m.group(1), m.group(2)
            return [f"{g}={opt!r}: unknown option; expected one of {', '.join(options(g))}"]
        if m:
            return [f"{m.group(1)}: unknown group; expected one of {', '.join(GROUPS)}"]
    if "Config group override must be a string" in msg:  # ssm=0: a number where an option name is meant
        bad = next((o for o in overrides if o.lstrip("+").partition("=")[0] in GROUPS
                    and not re.fullmatch(r"[A-Za-z_]\w*", o.partition("=")[2])), None)
        if bad:
            g, _, opt = bad.lstrip("+").partition("=")
            return [f"{g}={opt!r}: unknown option; expected one of {', '.join(options(g))}"]
    if isinstance(exc, OverrideParseException):
        bad = next((o for o in overrides if o and o in msg), None) or _unparsable(overrides)
        return [f"{bad!r}: cannot parse override ({_first(msg)}); expected key=value, group=option, "
                f"+key=value or ~key (Hydra override grammar)"]
    m = re.search(r"Could not override '([^']+)'", msg)
    if m and ("not in struct" in msg or "To append to your config" in msg):
        key = m.group(1)
        given = next((o.partition("=")[2] for o in overrides if o.partition("=")[0] == key), "")
        group = key.split(".")[0]
        known = _fields(group, overrides) if group in GROUPS else ", ".join(GROUPS)
        parts = key.split(".")
        if group in GROUPS and len(parts) > 2 and _mapping_field(group, parts[1], overrides):
            # a new key inside a mapping field (model.overrides.hidden_size): Hydra adds keys only with '+'
            return [f"{key}={given!r}: {'.'.join(parts[:2])} is a mapping and {parts[2]!r} is not in it yet; "
                    f"expected +{key}={given}"]
        return [f"{key}={given!r}: unknown key; expected one of {known}"]
    m = re.search(r"Could not append to config\. An item is already at '([^']+)'", msg)
    if m:
        return [f"+{m.group(1)}: the key exists already; expected {m.group(1)}=... without '+'"]
    m = re.search(r"Could not (?:delete|override) (?:from config\. )?'?([^'\s]+)'?", msg)
    if m:
        return [f"{m.group(1)}: {_first(msg.split(chr(10), 1)[-1]) or _first(msg)}"]
    full = getattr(exc, "full_key", None)
    if full:
        given = next((o.partition("=")[2] for o in overrides if o.lstrip("+").partition("=")[0] == full), None)
        what = f"{full}={given!r}" if given is not None else full
        return [f"{what}: {_first(msg)}; expected a value or a ${{...}} naming an existing key"]
    # No key in Hydra's message: name the override it rejected (or the whole command line).
    culprit = next((o for o in overrides if o.startswith("=") or o.endswith("=")), None) or " ".join(overrides)
    return [f"{culprit!r}: {_first(msg)}; expected key=value or group=option"]


def _unparsable(overrides: list[str]) -> str:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_override(o)
        except Exception:
            return o
    return " ".join(overrides)


def compose_checked(overrides: list[str]):
    """Compose + resolve + validate exactly as the job will; ConfigError with one line per problem."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .compose import compose_node
    from .schema import validate
    try:
        raw = OmegaConf.to_container(compose_node(overrides), resolve=True)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        lines = format_hydra_error(e, overrides)
        cause = e.__cause__
        if lines == [_first(str(e))] and cause is not None and getattr(cause, "full_key", None):
            lines = format_hydra_error(cause, overrides)
        raise ConfigError(lines) from None
    raw.pop("hydra", None)
    try:
        return validate(raw)
    except ConfigError as e:
        hint = _kind_hint(overrides)
        raise ConfigError([hint] if hint else e.lines) from None


def _kind_hint(overrides: list[str]) -> str | None:
    """`pipeline.kind=eval` keeps the decode option's other fields (unknown keys to eval): the option is what
    was meant."""
    for o in overrides:
        key, _, v = o.lstrip("+").partition("=")
        g, _, field = key.partition(".")
        if field == "kind" and g in GROUPS and v in options(g):
            return (f"{key}={v!r}: changes the kind but keeps the {g} option's other fields; expected {g}={v} "
                    f"(the option with its own defaults)")
    return None


def help_text() -> str:
    """Groups, their options and every field's description (what `--help` prints)."""
    from .components import load_all
    load_all()
    out = ["synodic: python run.py [group=option ...] [key=value ...]  (Hydra overrides; --cfg job prints the "
           "composed config)", ""]
    chosen = _chosen([])
    for g in GROUPS:
        out.append(f"{g}: {', '.join(options(g))}  (default: {chosen.get(g, '-')})")
        seen = set()
        for kind, cls in sorted(REGISTRIES[g].classes.items()):
            if cls in seen:
                continue
            seen.add(cls)
            out.append(f"  {g}={kind}: {(cls.__doc__ or '').strip().splitlines()[0] if cls.__doc__ else ''}")
            for name, f in cls.model_fields.items():
                if name != "kind":
                    out.append(f"    {g}.{name} (default {f.get_default(call_default_factory=True)!r}): "
                               f"{f.description}")
    out += ["", "Bad input prints one line per problem and exits with code 2 (SYNODIC_TRACEBACK=1: traceback)."]
    return "\n".join(out)


def check(argv: list[str]) -> tuple[int | None, list[str]]:
    """(exit code or None to go on, lines to print). In-process path of `guard` (tests use it)."""
    overrides, flags = split_argv(argv)
    if any(f in ("--help", "-h") for f in flags):
        return 0, help_text().splitlines()
    if any(f in ("--hydra-help", "--version", "--shell-completion", "-sc") for f in flags):
        return None, []
    multirun = any(f.startswith("--multirun") or f == "-m" for f in flags)
    try:
        if multirun:  # each job is validated by check_multirun; here the sweep syntax and Hydra's own config
            from .multirun import jobs
            jobs(overrides)
            overrides = []
        else:
            compose_checked(overrides)
    except ConfigError as e:
        return 2, [f"error: {line}" for line in e.lines]
    bad = _config_name_problem(flags) or _hydra_problem(overrides, flags) or \
        _run_dir_problem(overrides + flags, "hydra.sweep.dir" if multirun else "hydra.run.dir") or \
        _logging_problem(flags) or _output_subdir_problem(flags)
    return (2, [f"error: {bad}"]) if bad else (None, [])


def _config_name_problem(flags: list[str]) -> str | None:
    """synodic has one top-level config; groups are chosen with group=option, never with --config-name. A
    --config-path must hold it (Hydra's own message is several lines), a --config-dir must be a directory."""
    for i, f in enumerate(flags[:-1]):
        v = flags[i + 1]
        if f in ("--config-name", "-cn") and v != "config":
            return f"{f}={v!r}: unknown config; expected config (choose groups with group=option)"
        path = v.removeprefix("file://")
        # relative paths are Hydra's to resolve (against the entry point's module), absolute ones are checked here
        if f in ("--config-path", "-cp") and not v.startswith("pkg://") and Path(path).is_absolute() \
                and not (Path(path) / "config.yaml").is_file():
            return (f"{f}={v!r}: no config.yaml there; expected a directory holding synodic's config.yaml "
                    f"(or no {f}: the packaged conf/ is used)")
        if f in ("--config-dir", "-cd") and not Path(path).is_dir():
            return f"{f}={v!r}: no such directory; expected a directory of extra config groups"
    return None


def _hydra_problem(overrides: list[str], flags: list[str]) -> str | None:
    """Overrides of Hydra's own config (hydra/launcher=..., hydra.job.chdir=...): composed with the job's, as
    Hydra's main will, so an unknown option or key is one line instead of Hydra's multi-line message."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .compose import compose_node
    own = [f for f in flags if not f.startswith("-") and f.lstrip("+~").startswith("hydra")]
    if not own:
        return None
    try:
        compose_node(overrides + own, hydra=True)
    except ConfigError as e:
        return e.lines[0]
    except (HydraException, OmegaConfBaseException, ValueError, AttributeError, TypeError) as e:
        msg = str(e)
        m = re.search(r"full_key: (\S+)", msg)
        if "'NoneType' object" in msg and m:  # OmegaConf merging a mapping into a node Hydra's config holds null
            bad = next((o for o in own if o.lstrip("+").partition("=")[0] == m.group(1)), m.group(1))
            return (f"{bad!r}: Hydra's config holds null at {m.group(1)}, nothing to merge this value into; "
                    f"expected the setting as plain overrides (with -m: key=a,b sweeps)")
        m = re.search(r"Could not find '(hydra/[^']+)/([^']+)'", msg)
        if m:
            avail = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)*)", msg)
            known = ", ".join(a.strip() for a in avail.group(1).splitlines() if a.strip()) if avail else ""
            return f"{m.group(1)}={m.group(2)!r}: unknown option; expected one of {known or '-'}"
        m = re.search(r"Could not override '([^']+)'", msg)
        if m:
            given = next((o.partition("=")[2] for o in own if o.partition("=")[0] == m.group(1)), "")
            return (f"{m.group(1)}={given!r}: unknown key of Hydra's config; expected one of "
                    f"{_hydra_keys(m.group(1))}")
        bad = next((o for o in own if o in msg), own[0])
        why = _first(str(e.__cause__)) if e.__cause__ is not None else _first(msg)
        return f"{bad!r}: {why}; expected a value of the type Hydra's config holds there"
    return None


def _hydra_keys(key: str) -> str:
    """The keys Hydra's config holds beside `key` (hydra.nope → run, sweep, job, ...)."""
    from omegaconf import OmegaConf

    from .compose import compose_node
    parent = OmegaConf.select(compose_node(hydra=True), key.rpartition(".")[0] or key)
    return ", ".join(sorted(parent.keys())) if hasattr(parent, "keys") else "the keys of Hydra's config"


def _run_dir_problem(overrides: list[str], key: str = "hydra.run.dir") -> str | None:
    """Hydra creates the run (or -m: sweep) directory before the job, with a traceback when it cannot: check it
    first (the default `outputs/...` / `multirun/...` under the current directory, or `hydra.run.dir=`)."""
    from .files import writable_dir_problem
    default = "outputs" if key == "hydra.run.dir" else "multirun"
    given = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == key]
    if given and not given[-1].strip():  # Hydra would take '' as the current directory and write the run there
        return f"{key}='': an empty path; expected a directory to write the run into"
    path = given[-1] if given else default
    if "${" in path:  # an interpolation (e.g. ${now:...}): its fixed prefix is what must be creatable
        path = path.split("${", 1)[0] or "."
    why = writable_dir_problem(path)
    if why is None and given and key == "hydra.run.dir" and path == given[-1]:
        why = _run_dir_entry_problem(Path(path))
    if why is None:
        return None
    where = f"{key}={path!r}" if given else f"{key} ({default}/ under {os.getcwd()})"
    return f"{where}: {why}"


# what a run writes into its directory, by kind: one of another kind in the way is a traceback mid-run (or, for
# results.json, after the whole run)
_RUN_DIR_ENTRIES = {"results.json": "file", "run.log": "file", ".synodic.lock": "file", ".hydra": "directory"}


def _run_dir_entry_problem(run_dir: Path) -> str | None:
    for name, kind in _RUN_DIR_ENTRIES.items():
        p = run_dir / name
        if p.exists() and p.is_dir() != (kind == "directory"):
            other = "directory" if p.is_dir() else "file"
            return f"{name} there is a {other}; expected a {kind} of the run's own (or nothing) by that name"
    return None


def _given(flags: list[str], key: str) -> str | None:
    vals = [f.partition("=")[2] for f in flags if f.lstrip("+").partition("=")[0] == key]
    return vals[-1] if vals else None


def _logging_problem(flags: list[str]) -> str | None:
    """Hydra configures logging when the job starts and fails with a traceback on a bad level or a log file it
    cannot create: the levels and file names given on the command line are checked first."""
    import logging
    for f in flags:
        key, _, v = f.lstrip("+").partition("=")
        if not re.fullmatch(r"hydra\.(job|hydra)_logging\..*", key) or "${" in v:
            continue
        last = key.rpartition(".")[2]
        if last == "level" and not v.isdigit() and not isinstance(logging.getLevelName(v.upper()), int):
            return (f"{key}={v!r}: unknown logging level; expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL "
                    f"(or a number)")
        if last == "filename":
            from .files import writable_dir_problem
            why = ("an empty path; expected a file name" if not v.strip()
                   else writable_dir_problem(Path(v).expanduser().absolute().parent))
            if why:
                return f"{key}={v!r}: the log file's folder: {why}"
    return None


def _output_subdir_problem(flags: list[str]) -> str | None:
    """hydra.output_subdir is made inside the run dir when the job starts (an absolute path anywhere): a file
    in the way is a traceback there, so it is checked first where the path is known."""
    sub = _given(flags, "hydra.output_subdir")
    if sub is None or sub in ("null", "") or "${" in sub:
        return None
    run_dir = _given(flags, "hydra.run.dir")
    if not Path(sub).is_absolute() and (run_dir is None or "${" in run_dir):
        return None
    from .files import writable_dir_problem
    why = writable_dir_problem(Path(run_dir or ".") / sub)
    return f"hydra.output_subdir={sub!r}: {why}" if why else None


def guard(argv: list[str] | None = None) -> None:
    """Call before Hydra's main: prints help or the one-line errors and exits; returns when argv is good."""
    if os.environ.get("SYNODIC_TRACEBACK"):
        return
    code, lines = check(list(sys.argv[1:] if argv is None else argv))
    if code is None:
        return
    stream = sys.stdout if code == 0 else sys.stderr
    for line in lines:
        print(line, file=stream)
    sys.exit(code)
