"""Tenants through the whole system: API keys at the gateway, sessions in each tenant's own
namespace (real Redis, gRPC, a worker process, the real model)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gateway.auth import hash_key
from tests.test_kvstore_cluster import NEW_TOKENS
from warmfleet.client import Client
from warmfleet.launcher import Cluster
from warmfleet.v1 import inference_pb2 as pb

pytestmark = pytest.mark.slow
KEYS = {"alice": "alice-secret", "bob": "bob-secret"}
MESSAGES = [{"role": "user", "content": "Name a large animal."}]


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        f'[[keys]]\nsha256 = "{hash_key(KEYS["alice"])}"\ntenant = "alice"\n'
        'max_priority = "interactive"\n'
        f'[[keys]]\nsha256 = "{hash_key(KEYS["bob"])}"\ntenant = "bob"\n'
        'max_priority = "normal"\n',
        encoding="utf-8",
    )
    with Cluster(
        num_workers=1,
        model=default_model_path,
        keys_file=keys,
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as c:
        yield c


def client(cluster: Cluster, tenant: str | None) -> Client:
    return Client(cluster.target, timeout_s=120, api_key=KEYS.get(tenant or ""))


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()


def test_keys_are_required_and_priorities_capped(cluster: Cluster) -> None:
    with client(cluster, None) as anonymous:
        assert code_of(lambda: anonymous.complete("s", messages=MESSAGES)) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert code_of(anonymous.list_sessions) == grpc.StatusCode.UNAUTHENTICATED
    with Client(cluster.target, api_key="not-a-key") as stranger:
        assert code_of(lambda: stranger.get_session("s")) == grpc.StatusCode.UNAUTHENTICATED
    with client(cluster, "bob") as bob:
        denied = code_of(
            lambda: bob.complete("s", messages=MESSAGES, max_tokens=2, priority="interactive")
        )
        assert denied == grpc.StatusCode.PERMISSION_DENIED
        reply = bob.complete("s", messages=MESSAGES, max_tokens=2, priority="batch")
        assert len(reply.token_ids) == 2


def test_one_session_id_names_two_sessions_of_two_tenants(cluster: Cluster) -> None:
    with client(cluster, "alice") as alice, client(cluster, "bob") as bob:
        first = alice.complete("shared-id", messages=MESSAGES, max_tokens=NEW_TOKENS)
        assert first.completion.kv_source == pb.KV_SOURCE_COLD
        # bob's request with alice's session id gets bob's own, empty session
        theirs = bob.complete("shared-id", messages=MESSAGES, max_tokens=NEW_TOKENS)
        assert theirs.completion.kv_source == pb.KV_SOURCE_COLD
        assert theirs.completion.usage.cached_tokens == 0
        assert theirs.token_ids == first.token_ids  # same prompt, same tokens: none of alice's KV
        again = alice.complete("shared-id", messages=MESSAGES, max_tokens=NEW_TOKENS)
        assert again.completion.kv_source == pb.KV_SOURCE_WARM  # alice's KV was untouched
        # bob sees only his own sessions, and cannot reach alice's
        alice.complete("alice-only", messages=MESSAGES, max_tokens=2)
        assert "alice-only" not in {s.session_id for s in bob.list_sessions()}
        assert "alice-only" in {s.session_id for s in alice.list_sessions()}
        assert code_of(lambda: bob.get_session("alice-only")) == grpc.StatusCode.NOT_FOUND
        fork = code_of(lambda: bob.fork_session("alice-only", "stolen"))
        assert fork == grpc.StatusCode.NOT_FOUND
        assert bob.delete_session("alice-only") is False
        assert alice.get_session("alice-only").num_tokens > 0
