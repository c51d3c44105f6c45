"""Starting or joining Ray, for every part of synodic that runs on it (decode replicas, quantization
tasks). An address that nothing answers is refused within seconds, before Ray's own retries."""
from contextlib import contextmanager

from synodic.config.errors import ConfigError

PROBE_TIMEOUT_S = 3.0


def check_reachable(address: str, key: str) -> None:
    """A `host:port` or `ray://host:port` address must accept a TCP connection (the GCS or the Ray client
    server); `auto` is left to Ray, which fails at once when no local cluster is running."""
    from synodic.config.netcheck import unreachable
    why = unreachable(address, PROBE_TIMEOUT_S)
    if why:
        raise ConfigError([f"{key}={address!r}: {why}; expected a running Ray cluster (`ray start --head`), or "
                           f"null to start a local one"])


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
