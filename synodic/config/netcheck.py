"""A quick TCP probe of host:port addresses, so an unreachable cluster fails in seconds, not a hang."""
from __future__ import annotations

import socket
from typing import Annotated

from pydantic import AfterValidator


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


def address_form(address: str | None) -> str | None:
    """A Ray address as the fields take it (null, 'auto', 'host:port' or 'ray://host:port'), checked for its form:
    Ray's own parse errors are tracebacks, and an empty string would silently mean null."""
    if address is None or address == "auto":
        return address
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError("expected 'auto', 'host:port' (a port 1-65535), 'ray://host:port', or null to start a "
                         "local Ray instance")
    return address


RayAddress = Annotated[str | None, AfterValidator(address_form)]
