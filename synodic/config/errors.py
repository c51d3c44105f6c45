"""One line per problem: the key, the value given and what was expected."""
from __future__ import annotations

from pydantic import ValidationError


class ConfigError(Exception):
    """Bad user input; `lines` are printed one per problem and the run exits with code 2."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def _short(v, limit: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def format_validation_error(err: ValidationError, registries=None) -> list[str]:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e["loc"]]
        cls = None
        if len(loc) >= 2 and registries and loc[0] in registries:
            cls = registries[loc[0]].classes.get(loc[1]) or next(iter(registries[loc[0]].classes.values()), None)
        # Drop the discriminator tag pydantic inserts for tagged unions (ssm.eager.state_dtype → ssm.state_dtype).
        if len(loc) >= 2 and registries and loc[0] in registries and loc[1] in registries[loc[0]].classes:
            loc = [loc[0]] + loc[2:]
        if not loc and e["type"] == "value_error":
            # a cross-group rule: its message names the keys; never the dumped config it was given
            lines += e["msg"].removeprefix("Value error, ").split("; ")
            continue
        key = ".".join(loc) or "<root>"
        typ, given = e["type"], e.get("input")
        if typ == "union_tag_invalid" and registries and loc and loc[0] in registries:
            expected = "one of " + ", ".join(registries[loc[0]].kinds())
            lines.append(f"{key}.kind={_short(e['ctx']['tag'])}: expected {expected}")
        elif typ == "literal_error" and loc[-1] == "kind" and registries and loc[0] in registries:
            lines.append(f"{key}={_short(given)}: expected one of {', '.join(registries[loc[0]].kinds())}")
        elif typ == "literal_error":
            lines.append(f"{key}={_short(given)}: expected one of {e['ctx']['expected']}")
        elif typ == "extra_forbidden":
            fields = ", ".join(sorted(cls.model_fields)) if cls is not None else "the documented fields"
            lines.append(f"{key}={_short(given)}: unknown key; expected one of {fields}")
        elif typ == "missing":
            lines.append(f"{key}: missing; expected a value")
        elif typ == "value_error" and isinstance(given, dict):
            # a component's own rule over several of its fields: the message names them, never the dumped group
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(msg if msg.startswith(f"{key}.") else f"{key}: {msg}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{key}={_short(given)}: {msg}")
    return lines
