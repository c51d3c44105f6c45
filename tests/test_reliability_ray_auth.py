"""Joining a Ray cluster that uses token authentication: a GCS that refuses this process's token (or its
lack of one) is one line naming what to set; an accepted token turns RAY_AUTH_MODE=token on for ray.init; a
server that answers without being a GCS is one line at once (not Ray's ~20 s of retries).
A stand-in GCS (Ray's own generated gRPC service, answering only with the right bearer token) keeps this
fast; docs in README's Ray section say how to try it against `ray start --head`."""
from concurrent import futures

import grpc
import pytest
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

from synodic.config import ConfigError
from synodic.distributed import cluster

TOKEN = "0123456789abcdef0123456789abcdef"


class _GCS(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
    def GetClusterId(self, request, context):
        if dict(context.invocation_metadata()).get("authorization") != f"Bearer {TOKEN}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")
        return gcs_service_pb2.GetClusterIdReply(cluster_id=b"x" * 28)


@pytest.fixture(scope="module")
def gcs():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(_GCS(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture
def env(monkeypatch, tmp_path):
    for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.setenv(k, "")  # recorded, so what check_token sets is undone after each test
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    monkeypatch.setattr(cluster, "_reread_ray_config", lambda: None, raising=False)
    return monkeypatch


def test_no_token_is_one_line_saying_what_to_set(gcs, env):
    with pytest.raises(ConfigError) as e:
        cluster.check_token(gcs, "pipeline.ray_address")
    (line,) = e.value.lines
    assert line.startswith(f"pipeline.ray_address='{gcs}'") and "no token" in line and "RAY_AUTH_TOKEN" in line


def test_wrong_token_names_where_it_came_from(gcs, env, tmp_path):
    f = tmp_path / "tok"
    f.write_text("wrong\n")
    env.setenv("RAY_AUTH_TOKEN_PATH", str(f))
    with pytest.raises(ConfigError) as e:
        cluster.check_token(gcs, "runtime.address")
    (line,) = e.value.lines
    assert "runtime.address" in line and f"token from {f} was refused" in line


def test_accepted_token_turns_token_mode_on(gcs, env, tmp_path):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(TOKEN)
    cluster.check_token(gcs, "pipeline.ray_address")
    import os
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_env_token_wins_and_ray_client_addresses_are_left_to_ray(gcs, env):
    env.setenv("RAY_AUTH_TOKEN", TOKEN)
    env.setenv("RAY_AUTH_MODE", "token")
    cluster.check_token(gcs, "pipeline.ray_address")
    cluster.check_token("ray://127.0.0.1:1", "pipeline.ray_address")  # not probed: no error, no wait


def test_a_server_that_is_not_a_gcs_is_one_line_at_once(env):
    """A gRPC server without Ray's services answers GetClusterId with UNIMPLEMENTED."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(ConfigError) as e:
            cluster.check_token(f"127.0.0.1:{port}", "runtime.address")
        (line,) = e.value.lines
        assert "is not a Ray GCS" in line and "runtime.address" in line
    finally:
        server.stop(None)
