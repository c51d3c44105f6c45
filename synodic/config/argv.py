"""key=value command lines of the module entry points (python -m synodic.train / synodic.data): --help
prints the module's usage (and the fields of its settings class), bad input one line and exit 2."""
from __future__ import annotations

import sys
from contextlib import contextmanager

from pydantic import ValidationError

from .errors import ConfigError, format_validation_error


def parse_kv(argv: list[str], doc: str, settings_cls=None) -> dict[str, str]:
    if any(a in ("-h", "--help") for a in argv):
        print((doc or "").strip())
        if settings_cls is not None:
            for name, f in settings_cls.model_fields.items():
                if name != "kind":
                    print(f"  {name} (default {f.get_default(call_default_factory=True)!r}): {f.description}")
        raise SystemExit(0)
    bad = [a for a in argv if "=" not in a or a.startswith("=")]
    if bad:
        raise ConfigError([f"{a!r}: expected key=value (--help lists the keys)" for a in bad])
    return dict(a.split("=", 1) for a in argv)


@contextmanager
def one_line_errors(prefix: str = "", model=None):
    """ConfigError / ValidationError → `error: ...` lines on stderr and exit code 2 (`model`: the settings class,
    whose fields an unknown key's line lists)."""
    try:
        yield
    except ConfigError as e:
        _exit(e.lines)
    except ValidationError as e:
        _exit([prefix + line for line in format_validation_error(e, model=model)])


def _exit(lines: list[str]):
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    raise SystemExit(2)
