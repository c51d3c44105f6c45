"""Exclusive use of a run directory or a quantization-store entry by one process (filelock): a second
run on the same directory fails at once with one line instead of interleaving its writes."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from synodic.config.errors import ConfigError


@contextmanager
def exclusive(lock_path: str | Path, key: str, value, wait_s: float = 0.0):
    """Hold `lock_path` for the block; ConfigError naming `key=value` when another process holds it."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=wait_s)
    except Timeout:
        raise ConfigError([f"{key}={str(value)!r}: another synodic process is using it (lock {lock_path}); "
                           f"expected it to finish first, or a different {key}"]) from None
    try:
        yield
    finally:
        lock.release()
