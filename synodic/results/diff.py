"""What differs between two validated configs: flattened dumps compared key by key, never typed by hand."""


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def config_diff(old: dict, new: dict) -> dict[str, tuple]:
    """{key: (old value, new value)} for every key of either dump whose value differs (a key one side lacks:
    None there), keys in sorted order."""
    a, b = flatten(old), flatten(new)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def format_diff(diff: dict[str, tuple]) -> str:
    return "; ".join(f"{k}: {o!r} → {n!r}" for k, (o, n) in diff.items()) or "(same)"
