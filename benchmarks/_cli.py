"""Argument checks shared by the benchmark entry points. Bad input ends as argparse's usage line plus one error
line naming the argument, the value given and what was expected (exit code 2), before any work starts or any
file is written. Numbers and paths are checked as argparse `type=`s; config options with `compose_or_exit`."""
from __future__ import annotations

import argparse
import re
from pathlib import Path


def _number(text: str, cast, low: float, strict: bool, expected: str):
    try:
        v = cast(text)
    except ValueError:
        v = None
    if v is None or v != v or (v <= low if strict else v < low):  # (v != v: NaN)
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected {expected}")
    return v


def positive_int(text: str) -> int:
    return _number(text, int, 0, True, "an integer >= 1")


def nonnegative_int(text: str) -> int:
    return _number(text, int, 0, False, "an integer >= 0")


def positive_float(text: str) -> float:
    return _number(text, float, 0, True, "a number > 0")


def nonnegative_float(text: str) -> float:
    return _number(text, float, 0, False, "a number >= 0")


def _list_of(cast, low: float, strict: bool, expected: str):
    def parse(text: str) -> list:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected a comma-separated list of {expected}")
        try:
            return [_number(t.strip(), cast, low, strict, expected) for t in items]
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected a comma-separated list of "
                                             f"{expected}") from None
    return parse


positive_ints = _list_of(int, 0, True, "integers >= 1")
positive_floats = _list_of(float, 0, True, "numbers > 0")


def out_file(text: str) -> Path:
    """A file to write: its directory must exist (a typo in it would otherwise be created silently, or fail
    only after the run) and the path must not be a directory."""
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected a file path (it is a directory)")
    if not p.parent.is_dir():
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected a file path in an existing directory "
                                         f"(no directory {str(p.parent)!r})")
    return p


def compose_or_exit(ap: argparse.ArgumentParser, overrides: list[str], flags: dict[str, str] | None = None):
    """compose_checked(overrides), the RunConfig the job would run, or ap.error with its one-line problem.
    flags maps a config key (or its group) to the argument that set it, so the line names the argument:
    {"model": "--models"} turns `model='zzz': unknown option; ...` into `argument --models: model='zzz': ...`."""
    from synodic.config.errors import ConfigError
    from synodic.config.hydra_errors import compose_checked
    try:
        return compose_checked(list(overrides))
    except ConfigError as e:
        key = re.split(r"[=:\s]", e.lines[0].lstrip("'+~"), maxsplit=1)[0]
        flag = next((f for k, f in (flags or {}).items() if key == k or key.startswith(k + ".")), None)
        msg = "; ".join(e.lines)
        ap.error(f"argument {flag}: {msg}" if flag else msg)
