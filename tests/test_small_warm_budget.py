"""One worker whose warm budget is smaller than one session, with the kvstore running: each
session goes to disk after its turn and comes back from disk for the next one, used whole by
the request it was read back for; the worker never evicts on its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_helpers import (
    TOKEN_BYTES,
    Conversation,
    assert_exact,
    common_prefix,
    prompt_ids,
    recomputed,
    records,
    wait_for,
)
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
NUM_SESSIONS = 6


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(
        ClusterConfig(
            num_workers=1,
            model=default_model_path,
            spill_dir=tmp_path_factory.mktemp("spill"),
            warm_budget=10 * TOKEN_BYTES,  # every session here holds more than 10 positions
            log_dir=tmp_path_factory.mktemp("logs"),
        )
    ) as c:
        yield c


def test_every_resume_comes_back_from_disk_whole(cluster: Cluster, model: Model) -> None:
    agents = [Conversation(f"small-{i}") for i in range(NUM_SESSIONS)]
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)

    def all_on_disk() -> bool:
        index = records(r)
        return all(index.get(a.session_id, {}).get("tier") == "disk" for a in agents)

    with Client(cluster.target, timeout_s=120) as client:
        for round_ in range(3):
            for i, agent in enumerate(agents):
                agent.turn(client, f"Round {round_}: name an animal and a city, agent {i}.")
            wait_for(all_on_disk, "every session to be on disk")
    r.close()
    resumes = 0
    for agent in agents:
        previous: list[int] = []
        for turn, (messages, reply) in enumerate(agent.turns):
            prompt = prompt_ids(model, messages)
            c = reply.completion
            if turn == 0:
                assert recomputed(c)
            else:  # the file held the last turn whole: its prompt and all but its last token
                assert c.kv_source == pb.KV_SOURCE_DISK, (agent.session_id, turn)
                cached = common_prefix(previous[:-1], prompt)
                assert c.usage.cached_tokens == cached, (agent.session_id, turn)
                resumes += 1
            previous = prompt + reply.token_ids
    assert resumes == 2 * NUM_SESSIONS
    assert_exact(model, [t for a in agents for t in a.turns])
    log = cluster.log_path("w0").read_text()
    assert "read local/small-0 back from disk" in log
    assert "by the worker's own LRU" not in log
