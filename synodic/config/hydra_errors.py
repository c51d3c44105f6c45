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


def _first(msg: str) -> str:
    return " ".join(str(msg).strip().splitlines()[0].split()) if str(msg).strip() else type(msg).__name__


def format_hydra_error(exc: BaseException, overrides: list[str]) -> list[str]:
    """One line per problem for an exception raised while Hydra composes or OmegaConf resolves."""
    from hydra.errors import MissingConfigException, OverrideParseException
    msg = str(exc)
    if isinstance(exc, MissingConfigException) or "Could not find '" in msg:
        m = re.search(r"Could not find '([^']+)/([^']+)'", msg)
        if m and m.group(1) in GROUPS or (m and (CONF_DIR / m.group(1)).is_dir()):
            g, opt = m.group(1), m.group(2)
            return [f"{g}={opt!r}: unknown option; expected one of {', '.join(options(g))}"]
        if m:
            return [f"{m.group(1)}: unknown group; expected one of {', '.join(GROUPS)}"]
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
    return validate(raw)


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
    if any(f in ("--hydra-help", "--version", "--shell-completion", "-sc") for f in flags) or \
            any(f.startswith("--multirun") or f == "-m" for f in flags):
        return None, []
    try:
        compose_checked(overrides)
    except ConfigError as e:
        return 2, [f"error: {line}" for line in e.lines]
    bad = _config_name_problem(flags) or _hydra_problem(overrides, flags) or _run_dir_problem(overrides + flags)
    return (2, [f"error: {bad}"]) if bad else (None, [])


def _config_name_problem(flags: list[str]) -> str | None:
    """synodic has one top-level config; groups are chosen with group=option, never with --config-name."""
    for i, f in enumerate(flags[:-1]):
        if f in ("--config-name", "-cn") and flags[i + 1] != "config":
            return f"{f}={flags[i + 1]!r}: unknown config; expected config (choose groups with group=option)"
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
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        msg = str(e)
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


def _run_dir_problem(overrides: list[str]) -> str | None:
    """Hydra creates the run directory before the job, with a traceback when it cannot: check it first (the
    default `outputs/...` under the current directory, or `hydra.run.dir=`)."""
    from .files import writable_dir_problem
    given = [o.partition("=")[2] for o in overrides if o.partition("=")[0] == "hydra.run.dir"]
    path = given[-1] if given else "outputs"
    if "${" in path:  # an interpolation (e.g. ${now:...}): its fixed prefix is what must be creatable
        path = path.split("${", 1)[0] or "."
    why = writable_dir_problem(path)
    if why is None:
        return None
    where = f"hydra.run.dir={path!r}" if given else f"hydra.run.dir (outputs/ under {os.getcwd()})"
    return f"{where}: {why}"


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
