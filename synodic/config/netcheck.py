"""A quick TCP probe of host:port addresses, so an unreachable cluster fails in seconds, not a hang."""
from __future__ import annotations

import socket


def unreachable(address: str, timeout_s: float = 3.0) -> str | None:
    """Why `address` (host:port, optionally ray://) does not accept connections; None when it does or when
    the form is not host:port (e.g. 'auto', which Ray resolves itself)."""
    addr = address.removeprefix("ray://")
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as e:
        return f"nothing accepts connections at {host}:{port} ({e.strerror or type(e).__name__})"
