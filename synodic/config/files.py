"""Checks of the files a config names, run while the config is validated (before any work): prompt
text files and checkpoint directories. Each problem is one message naming the file and what was
expected; notes (a fallback taken, suspicious weights) go to stderr once per process."""
from __future__ import annotations

import json
import sys
from pathlib import Path

_NOTED: set[str] = set()
_SCAN_LIMIT = 256 * 2 ** 20   # NaN / inf scan of checkpoints up to this size (bigger ones would take long)


def note(msg: str) -> None:
    if msg not in _NOTED:
        _NOTED.add(msg)
        print(f"note: {msg}", file=sys.stderr)


def shown(path: str | Path, limit: int = 80) -> str:
    """`path` cut to `limit` characters for a message (a 5000-character value would bury the line)."""
    s = str(path)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def lookup_problem(path: str | Path) -> str | None:
    """Why the OS refuses to look `path` up at all (a name too long, a component it may not search): Path.is_file()
    and is_dir() raise OSError for these instead of answering False."""
    try:
        Path(path).exists()
    except OSError as e:
        return f"not a valid path ({e.strerror or e})"
    return None


def text_problem(path: str | Path, what: str = "a UTF-8 text file") -> str | None:
    """Why `path` is not a readable UTF-8 text file (None when it is)."""
    p = Path(path)
    bad = lookup_problem(p)
    if bad:
        return f"{bad}; expected {what}"
    if p.is_dir():
        return f"is a directory; expected {what}"
    if not p.is_file():
        return f"expected an existing file, {what} (no such file)"
    try:
        data = p.read_bytes()
    except OSError as e:
        return f"cannot read it ({e.strerror}); expected {what}"
    if not data.strip():
        return f"the file is empty; expected {what} with at least one non-blank line"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        return f"the file is UTF-16/32 (byte-order mark); expected {what} (iconv -f UTF-16 -t UTF-8)"
    if b"\x00" in data:
        return f"the file holds NUL bytes (binary?); expected {what}"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); expected {what}"
    return None


def checkpoint_problems(d: str | Path) -> list[str]:
    """Why directory `d` cannot be loaded as a checkpoint: config.json, model.safetensors, tokenizer.json."""
    from pydantic import ValidationError
    from safetensors import SafetensorError, safe_open

    from synodic.models.config import HybridConfig
    d = Path(d)
    bad = lookup_problem(d)
    if bad:
        return [f"{bad}; expected auto, random or a checkpoint directory"]
    if not d.is_dir():
        return [f"expected auto, random or a checkpoint directory (no directory {shown(d)})"]
    from synodic.models.hf import hf_problems, is_hf_folder
    if is_hf_folder(d):  # a Hugging Face folder: its own checks (synodic/models/hf)
        return hf_problems(d)
    out, cfg = [], None
    cj = d / "config.json"
    if not cj.is_file():
        out.append(f"no {cj}; expected a checkpoint directory with config.json + model.safetensors")
    else:
        try:
            cfg = HybridConfig.model_validate_json(cj.read_text())
        except (ValidationError, UnicodeDecodeError, OSError) as e:
            first = e.errors()[0] if isinstance(e, ValidationError) else {"msg": str(e), "loc": ()}
            where = ".".join(map(str, first["loc"]))
            out.append(f"{cj} is not a synodic model config ({where + ': ' if where else ''}"
                       f"{first['msg'][:100]}); expected the config.json a training run writes")
    st = d / "model.safetensors"
    if not st.is_file():
        out.append(f"no {st}; expected a checkpoint directory with config.json + model.safetensors")
    else:
        try:
            shapes = {k: shape for k, (_, shape) in safetensors_header(st).items()}
            # names and shapes against the model config.json describes (built on the meta device: no data read)
            from synodic.models.weights import layout_problem
            why = layout_problem(cfg, shapes, st) if cfg is not None else None
            if why:
                out.append(why)
            with safe_open(str(st), framework="pt") as f:
                keys = list(f.keys())
                size = st.stat().st_size
                if size <= _SCAN_LIMIT:
                    bad = [k for k in keys if not _finite(f.get_tensor(k))]
                    if bad:
                        note(f"model.weights={str(d)!r}: non-finite values (NaN / inf) in {len(bad)} tensor(s), "
                             f"e.g. {bad[0]}; outputs will be garbage")
        except (SafetensorError, OSError, RuntimeError, ValueError, KeyError) as e:
            why = str(e).splitlines()[0][:160]
            hint = "" if why.startswith("not a safetensors") else " (truncated copy?)"
            out.append(f"{st} cannot be read ({why}); expected a complete safetensors file{hint}")
    tj = d / "tokenizer.json"
    if tj.is_file():
        try:
            json.loads(tj.read_text())
            from tokenizers import Tokenizer
            n = Tokenizer.from_file(str(tj)).get_vocab_size(with_added_tokens=True)
        except Exception as e:  # tokenizers raises its own Exception subclass on any bad file
            out.append(f"{tj} is not a tokenizer ({str(e).splitlines()[0][:100]}); expected a Hugging Face "
                       f"tokenizers file, or none (raw UTF-8 bytes)")
        else:  # ids past the embedding's rows fail mid-decode (as synodic/models/hf checks for its folders)
            if cfg is not None and n > cfg.vocab_size:
                out.append(f"{tj} has {n} tokens; expected at most vocab_size={cfg.vocab_size} (config.json: the "
                           "embedding's rows)")
    elif not out:
        note(f"model.weights={str(d)!r}: no tokenizer.json there; prompts are encoded as raw UTF-8 bytes")
    return out


def _finite(t) -> bool:
    import torch
    return bool(torch.isfinite(t.float()).all()) if t.is_floating_point() and t.numel() else True




def layout_problem(want: dict, stored: dict, what: str) -> str | None:
    """Why tensors `stored` (name → shape, from a header) do not load into a module whose state dict is `want`
    (name → shape) — what load_state_dict(strict=True) would raise on — or None. `what` names the module in the
    message ("the nemotron_h model config.json describes")."""
    extra = [k for k in stored if k not in want]
    if extra:
        return (f"tensor {extra[0]!r} is not part of the {what} ({len(extra)} such); expected names such as "
                f"{next(iter(want))!r}")
    missing = [k for k in want if k not in stored]
    if missing:
        return f"no tensor {missing[0]!r} ({len(missing)} missing); expected every tensor of the {what}"
    bad = next((k for k, v in stored.items() if tuple(v) != tuple(want[k])), None)
    if bad is not None:
        return f"tensor {bad!r} has shape {list(stored[bad])}; expected {list(want[bad])} from config.json"
    return None


def safetensors_header(st: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name → (dtype, shape) of a safetensors file from its header alone (no tensor data read). ValueError naming
    what is wrong: a header that is not the format's JSON object of {dtype, shape, data_offsets} entries, or a copy
    cut short (a valid header whose data extent passes the end of the file)."""
    import struct
    st = Path(st)
    size = st.stat().st_size
    with open(st, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        n = struct.unpack("<Q", head)[0]
        if n > size - 8:
            raise ValueError("header length beyond the end of the file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"not a safetensors file: its header is not JSON ({str(e)[:60]})") from None
    if not isinstance(header, dict):
        raise ValueError(f"not a safetensors file: its header is a JSON {type(header).__name__}, not an object")
    out, end = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            continue
        offsets = v.get("data_offsets") if isinstance(v, dict) else None
        if not (isinstance(v, dict) and isinstance(v.get("dtype"), str) and _naturals(v.get("shape"))
                and _naturals(offsets) and len(offsets) == 2 and offsets[0] <= offsets[1]):
            raise ValueError(f"not a safetensors file: header entry {shown(k, 40)!r} is {shown(repr(v), 40)}, "
                             "not {dtype, shape, data_offsets: [begin, end]}")
        out[k] = (v["dtype"], tuple(v["shape"]))
        end = max(end, offsets[1])
    if size - 8 - n < end:
        raise ValueError(f"file ends {end - (size - 8 - n)} bytes before its last tensor")
    return out


def _naturals(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def writable_dir_problem(path: str | Path) -> str | None:
    """Why a directory cannot be created / written at `path` (checked before a long job starts)."""
    import os
    p = Path(path).expanduser().absolute()
    bad = lookup_problem(p)
    if bad:
        return f"{bad}; expected a writable directory"
    if p.exists() and not p.is_dir():
        return "exists and is not a directory; expected a writable directory"
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is a file; expected a writable directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable; expected a writable directory"
    import tempfile
    try:  # access() says yes to root almost everywhere (e.g. /proc): create and drop one file to be sure
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return f"{probe} is not writable ({e.strerror}); expected a writable directory"
    return None


def writable_dir_or_none(v: str | None) -> str | None:
    """A pydantic field validator's body for an output directory (None = not asked for): raises ValueError with
    writable_dir_problem's reason, so a long job never starts towards a place it cannot write."""
    why = None if v is None else ("an empty path; expected a directory" if not v.strip() else writable_dir_problem(v))
    if why:
        raise ValueError(why)
    return v


def data_problems(paths: list[str]) -> list[str]:
    """Why the training corpus `paths` cannot be built: per path, then the documents they hold together
    (one is held out, so at least two are needed). A prepared corpus folder (meta.json + train.bin) is taken
    as it is."""
    from synodic.data.corpus import list_documents
    out, docs = [], 0
    for i, s in enumerate(paths):
        p = Path(s)
        bad = lookup_problem(p)
        if not s.strip():
            out.append(f"[{i}]={s!r}: an empty path; expected text files or folders")
        elif bad:
            out.append(f"[{i}]={shown(s)!r}: {bad}; expected text files or folders")
        elif not p.exists():
            out.append(f"[{i}]={s!r}: no such file or directory; expected text files or folders")
        elif p.is_dir() and (p / "meta.json").is_file() and (p / "train.bin").is_file():
            docs += 2
        elif p.is_file():
            why = text_problem(p)
            if why:
                out.append(f"[{i}]={s!r}: {why}")
            docs += 1
        elif not p.is_dir():
            out.append(f"[{i}]={s!r}: neither a regular file nor a folder; expected text files or folders")
        else:
            n = len(list_documents(p))
            if not n:
                out.append(f"[{i}]={s!r}: no UTF-8 text document (.py, .txt, .md, .rst) in the folder; expected "
                           "text files or folders holding them")
            docs += n
    if paths and not out and docs < 2:   # [] is the shipped stdlib corpus
        out.append(f"the paths hold {docs} document; expected at least two (one is held out for evaluation)")
    return out


def quant_grid_problems(items: list[str], mode: str | None) -> list[str]:
    """Each 'format:method' entry validated as the quant group would validate it."""
    from pydantic import TypeAdapter, ValidationError

    from .components import load_all
    from .errors import format_validation_error
    from .registry import REGISTRIES
    load_all()
    formats = [k for k in REGISTRIES["quant"].kinds() if k != "none"]
    adapter = TypeAdapter(REGISTRIES["quant"].schema())
    out = []
    for i, item in enumerate(items):
        fmt, _, method = str(item).partition(":")
        if fmt not in formats:
            out.append(f"[{i}]={item!r}: unknown format {fmt!r}; expected 'format:method' with format one of "
                       f"{', '.join(formats)}")
            continue
        raw = {"kind": fmt, "method": method or "dualquant", "artifact": "none"}
        if mode is not None:
            raw["mode"] = mode
        try:
            adapter.validate_python(raw)
        except ValidationError as e:
            out += [f"[{i}]={item!r}: {line}" for line in format_validation_error(e)]
    return out


def architecture_note(model) -> None:
    """model=X with model.weights=<dir> holding another architecture runs the checkpoint's: say so."""
    if model.weights in ("auto", "random"):
        return
    from synodic.models.presets import PRESETS
    from synodic.models.weights import load_config
    try:
        got, want = load_config(model.weights), PRESETS[model.kind]
    except Exception:  # unloadable checkpoints are the weights validator's to report
        return
    if got.model_type != want.model_type:
        note(f"model={model.kind}: model.weights={model.weights} holds a {got.model_type} model "
             f"({got.num_hidden_layers} layers, hidden_size {got.hidden_size}), not the {model.kind} preset's "
             f"{want.model_type}; running the checkpoint's architecture")
