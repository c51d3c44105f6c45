"""Starting or joining Ray, for every part of synodic that runs on it (decode replicas, quantization
tasks). An address that nothing answers is refused within seconds, before Ray's own retries.

Token authentication (Ray >= 2.52, `RAY_AUTH_MODE=token` on the cluster): before joining a `host:port`
cluster, one GetClusterId call to its GCS, carrying the token this process would send, tells whether the
cluster wants a token and whether ours is accepted. A refusal is one line naming what to set, instead of
Ray's ~20 s of retries that end in "Failed to connect"; so is an address whose server answers without being a
GCS (UNIMPLEMENTED: another gRPC or HTTP/2 service, a proxy). When the token is accepted but RAY_AUTH_MODE is
unset here, it is set to `token` for this process, so ray.init sends it.
"""
import os
from contextlib import contextmanager
from pathlib import Path

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


def auth_token() -> tuple[str | None, str]:
    """(the token Ray would send, where it came from): RAY_AUTH_TOKEN, the file at RAY_AUTH_TOKEN_PATH,
    or ~/.ray/auth_token, in Ray's order."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    src = Path(path) if path else Path.home() / ".ray" / "auth_token"
    try:
        tok = src.read_text().strip()
    except OSError:
        return None, "no RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
    return (tok or None), str(src)


def check_token(address: str, key: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """ConfigError in one line when the GCS at `address` (host:port) refuses this process's token (or
    its lack of one). Other answers are left to ray.init."""
    if "://" in address or address == "auto":
        return  # Ray Client (ray://) and `auto` authenticate in their own way
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    tok, src = auth_token()
    md = [("authorization", f"Bearer {tok}")] if tok else []
    try:
        with grpc.insecure_channel(address) as ch:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(ch).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), metadata=md, timeout=timeout_s)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:  # something answers there, but not a Ray GCS
            raise ConfigError([f"{key}={address!r}: the server there answers but is not a Ray GCS (GetClusterId: "
                               f"{e.code().name}); expected the head node's GCS address (`ray start --head` "
                               "prints it; port 6379 by default)"]) from None
        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
            return
        have = f"the token from {src} was refused" if tok else f"this process has no token ({src})"
        raise ConfigError([f"{key}={address!r}: the cluster uses Ray token authentication and {have}; expected "
                           "RAY_AUTH_TOKEN set to the cluster's token (`ray get-auth-token` on the head node), "
                           "or RAY_AUTH_TOKEN_PATH naming a file that holds it"]) from None
    if tok and not os.environ.get("RAY_AUTH_MODE"):
        # accepted: make ray.init send it (this process and its children). Ray caches its config at import,
        # so it is re-read, as Ray itself does when it turns token mode on
        os.environ["RAY_AUTH_MODE"] = "token"
        _reread_ray_config()


def _reread_ray_config() -> None:
    from ray._raylet import Config
    Config.initialize("")


@contextmanager
def ray_session(address: str | None, key: str, num_cpus: int | None = None, num_gpus: int | None = None):
    """Ray for the duration of the block: joins `address` (checked first), or starts a local instance with
    these resources; an instance already running in this process is used as it is and left running."""
    import ray
    started = not ray.is_initialized()
    if started:
        if address:
            check_reachable(address, key)
            check_token(address, key)
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
