"""Starting or joining Ray, for every part of synodic that runs on it (decode replicas, quantization
tasks). An address that nothing answers is refused within seconds, before Ray's own retries."""
import socket
from contextlib import contextmanager
from urllib.parse import urlparse

from synodic.config.errors import ConfigError

PROBE_TIMEOUT_S = 3.0


def check_reachable(address: str, key: str) -> None:
    """A `host:port` or `ray://host:port` address must accept a TCP connection (the GCS or the Ray client
    server); `auto` is left to Ray, which fails at once when no local cluster is running."""
    if address == "auto":
        return
    url = urlparse(address if "://" in address else f"tcp://{address}")
    if not url.hostname or not url.port:
        raise ConfigError([f"{key}={address!r}: expected 'auto', 'host:port' or 'ray://host:port'"])
    try:
        socket.create_connection((url.hostname, url.port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError([f"{key}={address!r}: nothing answers at {url.hostname}:{url.port} "
                           f"({e.strerror or e}); expected a running Ray cluster (`ray start --head`), or null to "
                           f"start a local one"]) from None


@contextmanager
def ray_session(address: str | None, key: str, num_cpus: int | None = None, num_gpus: int | None = None):
    """Ray for the duration of the block: joins `address` (checked first), or starts a local instance with
    these resources; an instance already running in this process is used as it is and left running."""
    import ray
    started = not ray.is_initialized()
    if started:
        if address:
            check_reachable(address, key)
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as e:
                raise ConfigError([f"{key}={address!r}: {str(e).splitlines()[0]}"]) from None
        else:
            ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
