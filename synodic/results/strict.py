"""Strict JSON for results: a non-finite float becomes null and its key path is listed under
`non_finite`, so every JSON parser reads the file and nobody mistakes a missing value for a number."""
from __future__ import annotations

import math


def finite_only(obj, path: str = "", found: list[str] | None = None):
    """(copy of obj with inf / nan replaced by None, the dotted paths replaced)."""
    found = [] if found is None else found
    if isinstance(obj, float) and not math.isfinite(obj):
        found.append(path or "<root>")
        return None, found
    if isinstance(obj, dict):
        return {k: finite_only(v, f"{path}.{k}" if path else str(k), found)[0] for k, v in obj.items()}, found
    if isinstance(obj, (list, tuple)):
        return [finite_only(v, f"{path}[{i}]", found)[0] for i, v in enumerate(obj)], found
    return obj, found
