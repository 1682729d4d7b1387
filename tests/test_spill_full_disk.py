"""A spill directory that is full: writes fail, sessions are recomputed, no request fails.

The spill directory is a 1 MiB tmpfs where this machine lets us mount one (root with
CAP_SYS_ADMIN), else the children run under a 1 MiB file-size limit (RLIMIT_FSIZE; Python
ignores SIGXFSZ, so a write past it fails with EFBIG). A session's spill file is larger
than 1 MiB either way.
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib

from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_helpers import TOKEN_BYTES, Conversation, assert_exact, recomputed, settle
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from worker.shared_prefix import WORKERS_DIR

pytestmark = pytest.mark.slow
LIMIT = 1 << 20


def mount_tiny_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={LIMIT}", "tmpfs", str(path)]
    return subprocess.run(mount, capture_output=True, check=False).returncode == 0


@contextlib.contextmanager
def file_size_limit() -> Iterator[None]:
    """Processes started inside inherit a 1 MiB limit on the files they write."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.fixture(scope="module")
def full_cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    spill_dir = tmp_path_factory.mktemp("tiny") / "spill"
    cluster = Cluster(
        ClusterConfig(
            num_workers=1,
            model=default_model_path,
            spill_dir=spill_dir,
            warm_budget=TOKEN_BYTES,  # below any session: each is ordered to disk after its turn
            log_dir=tmp_path_factory.mktemp("logs"),
        )
    )
    mounted = mount_tiny_tmpfs(spill_dir)
    try:
        with contextlib.nullcontext() if mounted else file_size_limit():
            cluster.start()
        print(f"spill directory limited by {'tmpfs' if mounted else 'RLIMIT_FSIZE'}")
        yield cluster
    finally:
        cluster.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(spill_dir)], check=False)


def test_a_full_spill_directory_degrades_to_recompute(full_cluster: Cluster, model: Model) -> None:
    agents = [Conversation(f"full-{i}") for i in range(3)]
    r = redis_lib.Redis.from_url(full_cluster.redis_url, decode_responses=True)
    with (
        Client(full_cluster.target, timeout_s=120) as client,
        KVStoreClient(full_cluster.kvstore_target) as kv,
    ):
        for agent in agents:  # each is ordered to disk after its turn: its write fails
            agent.turn(client, f"Describe the colour of {agent.session_id}.")
            settle(r, kv)
        usage = kv.usage()
        assert usage.counters.failed_writes >= 2
        assert usage.counters.spills == 0 and usage.tiers.disk == 0
        assert full_cluster.spill_dir is not None
        files = [p for p in full_cluster.spill_dir.rglob("*") if p.is_file()]
        left = [p.name for p in files if p.parent.name != WORKERS_DIR]  # but running workers' marks
        assert not [n for n in left if not n.endswith(".wfkb")]  # no partial file left behind
        for agent in agents:  # every session still answers, the evicted ones recomputed
            reply = agent.turn(client, "And of the sea?")
            c = reply.completion
            assert recomputed(c) or c.kv_source == pb.KV_SOURCE_WARM
        assert sum(recomputed(a.turns[-1][1].completion) for a in agents) >= 2
    r.close()
    log = full_cluster.log_path("w0").read_text()
    assert "could not spill local/full-0" in log and "it will be recomputed" in log
    assert "No space left on device" in log or "File too large" in log
    assert_exact(model, [t for a in agents for t in a.turns])
