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


_SCALARS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "none": "null",
            "any": "anything"}
_PLURAL = {"int": "integers", "float": "numbers", "str": "strings", "bool": "booleans", "any": "values"}


def _union_member(part: str) -> bool:
    """A loc entry pydantic adds for one member of a plain union (`list[str]`, `int`), not a field name."""
    return "[" in part or part in _SCALARS


def _describe(t: str, plural: bool = False) -> str:
    """A union member's type in words: list[list[str]] → a list of lists of strings."""
    head, _, rest = t.partition("[")
    if head in ("list", "tuple", "set"):
        inner = _describe(rest[:-1], plural=True) if rest else "values"
        return f"lists of {inner}" if plural else f"a list of {inner}"
    if head == "literal":  # one allowed value is named as it is: `true or false or 'auto'`
        vals = rest[:-1]
        return vals if "," not in vals else f"one of {vals}"
    if head == "dict":
        return "mappings" if plural else "a mapping {key: value}"
    return _PLURAL.get(head, head) if plural else _SCALARS.get(head, head)


def _untagged(loc: list[str], registries) -> list[str]:
    """loc without the tag pydantic inserts for a tagged union (ssm.eager.state_dtype → ssm.state_dtype)."""
    if len(loc) >= 2 and registries and loc[0] in registries and loc[1] in registries[loc[0]].classes:
        return [loc[0]] + loc[2:]
    return loc


def _union_lines(errors: list[dict], registries) -> tuple[list[str], set[int]]:
    """One line per field of a plain union that no member accepted (pydantic reports one error per member, named
    by its type): `key=value: expected a mapping {key: value} or a list of strings`; and the errors it covers."""
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(errors):
        loc = [str(p) for p in e["loc"]]
        at = next((j for j in range(1, len(loc)) if _union_member(loc[j])), None)
        if at is not None:
            groups.setdefault(tuple(loc[:at]), []).append(i)
    lines, covered = [], set()
    for prefix, idx in groups.items():
        members = list(dict.fromkeys(str(errors[i]["loc"][len(prefix)]) for i in idx))
        if len(members) < 2:
            continue
        given = next((errors[i].get("input") for i in idx if len(errors[i]["loc"]) == len(prefix) + 1), None)
        lines.append(f"{'.'.join(_untagged(list(prefix), registries))}={_short(given)}: expected "
                     + " or ".join(_describe(m) for m in members if m != "none"))
        covered.update(idx)
    return lines, covered


def format_validation_error(err: ValidationError, registries=None, model=None) -> list[str]:
    """One line per problem; `model`: the class validated, whose fields an unknown key's line lists (where no
    registry names them)."""
    errors = err.errors()
    lines, covered = _union_lines(errors, registries)
    for i, e in enumerate(errors):
        if i in covered:
            continue
        loc = [str(p) for p in e["loc"]]
        cls = None
        if len(loc) >= 2 and registries and loc[0] in registries:
            cls = registries[loc[0]].classes.get(loc[1]) or next(iter(registries[loc[0]].classes.values()), None)
        if cls is None and len(loc) == 1:
            cls = model
        loc = _untagged(loc, registries)
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
            want = _expected(typ, e.get("ctx") or {})
            lines.append(f"{key}={_short(given)}: {msg}" + (f"; {want}" if want and "expected" not in msg else ""))
    return lines


def _expected(typ: str, ctx: dict) -> str | None:
    """pydantic's own messages ('Input should be ...') as the 'expected' clause of a one-line error."""
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
              "less_than": ("<", "lt")}
    if typ in bounds:
        op, k = bounds[typ]
        return f"expected a value {op} {ctx.get(k)}"
    if typ in ("too_short", "too_long"):
        n = ctx.get("min_length" if typ == "too_short" else "max_length")
        return f"expected {'at least' if typ == 'too_short' else 'at most'} {n} item{'s' if n != 1 else ''}"
    kinds = {"string_type": "a string", "int_type": "an integer", "int_parsing": "an integer",
             "int_from_float": "an integer", "float_type": "a number", "float_parsing": "a number",
             "bool_type": "true or false", "bool_parsing": "true or false", "list_type": "a list",
             "dict_type": "a mapping {key: value}", "finite_number": "a finite number", "tuple_type": "a list"}
    return f"expected {kinds[typ]}" if typ in kinds else None


class PartialResults(Exception):
    """A pipeline stopped part-way through: `payload` is what finished (written as results.json before the run
    exits, so work already done is not lost) and `cause` the failure (a ConfigError exits 2 in one line)."""

    def __init__(self, payload: dict, cause: BaseException, where: str = "", dest=None):
        super().__init__(str(cause))
        self.payload, self.cause, self.where = payload, cause, where  # where: what was running (a variant)
        self.dest = dest  # the directory its files went to (None: the run directory; results.partial_dir)
