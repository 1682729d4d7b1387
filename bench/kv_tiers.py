"""KV tiers: time to first token when a session of about --context tokens resumes warm (KV in
the worker's pool), from its spill file on disk, and recomputed (a new session id, same
prompt); and the spill files' write and restore throughput.

    .venv/bin/python -m bench.kv_tiers [--model PATH] [--context 2000] [--repeats 3]

One worker with every core. Its warm budget holds one such session but not two, so running a
second session of the same size pushes the first one to disk. The page cache is dropped
before every disk read where the machine allows it (as root: /proc/sys/vm/drop_caches; else
posix_fadvise(DONTNEED) on the spill files); the output says which. Figures are medians of
--repeats; ratios are taken within the run. Progress goes to stderr, the tables to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.table import print_table
from engine.chat import render_chat
from engine.config import ModelConfig
from engine.gguf_file import open_gguf, read_metadata
from engine.kv_cache import GROW_TOKENS
from engine.tokenizer import Tokenizer
from warmfleet.client import Client, collect
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model
from warmfleet.v1 import inference_pb2 as pb
from worker.spill import SpilledKV, SpillStore

MAX_TOKENS = 4
DTYPE_BYTES = 4  # the worker's default dtype, float32
SETTLE_TIMEOUT_S = 120.0
QUESTIONS = ("Summarize the log in one word.", "And in two words?", "Now in three words?")
SOURCE_NAMES: dict[int, str] = {
    pb.KV_SOURCE_COLD: "cold",
    pb.KV_SOURCE_WARM: "warm",
    pb.KV_SOURCE_DISK: "disk",
}
Messages = list[dict[str, str]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- the page cache ------------------------------------------------------------------------


def drop_page_cache(paths: Sequence[Path]) -> str:
    """Drop cached pages of `paths` (after a sync); returns how it was done."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "global drop_caches"
    except OSError:
        pass
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "posix_fadvise DONTNEED"
    except (OSError, AttributeError):
        return "none (page cache kept)"


def resident_bytes(paths: Sequence[Path]) -> int | None:
    """Bytes of `paths` in the page cache, from util-linux `fincore`; None if unknown."""
    if not paths or shutil.which("fincore") is None:
        return None
    cmd = ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, paths)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=10)
        return sum(int(x) for x in out.stdout.split())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


# --- the spill files' throughput --------------------------------------------------------------


def spill_throughput(
    config: ModelConfig, tokens: int, repeats: int
) -> tuple[list[tuple[str, str, str, str]], set[str]]:
    """Write and read one `tokens`-position KV of the model's shape with SpillStore."""
    shape = (config.num_layers, config.num_kv_heads, tokens, config.head_dim)
    rng = np.random.default_rng(0)
    k = rng.standard_normal(shape, dtype=np.float32)
    v = rng.standard_normal(shape, dtype=np.float32)
    kv = SpilledKV(k, v, list(range(tokens)))
    like = (config.num_layers, config.num_kv_heads, config.head_dim)
    mb = (k.nbytes + v.nbytes) / 1e6
    times: dict[str, list[float]] = {"write": [], "cold": [], "cached": [], "raw": []}
    methods: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="wf-kvtiers-") as d:
        store = SpillStore(d, "bench")
        path = store.path_for("s")
        for _ in range(repeats):
            t = time.perf_counter()
            store.write("s", kv)
            times["write"].append(time.perf_counter() - t)
            methods.add(drop_page_cache([path]))
            t = time.perf_counter()
            back = store.read("s", like=like, dtype=np.dtype(np.float32))
            times["cold"].append(time.perf_counter() - t)
            assert back is not None and np.array_equal(back.v, v)
            t = time.perf_counter()
            store.read("s", like=like, dtype=np.dtype(np.float32))
            times["cached"].append(time.perf_counter() - t)
            drop_page_cache([path])
            t = time.perf_counter()
            path.read_bytes()
            times["raw"].append(time.perf_counter() - t)
    rows = []
    labels = {
        "write": "spill write (xxh3 + write + fsync + rename)",
        "cold": "restore read, page cache dropped (read + checks + xxh3)",
        "cached": "restore read, file in page cache",
        "raw": "plain read_bytes of the file, page cache dropped",
    }
    for name, label in labels.items():
        med = statistics.median(times[name])
        rows.append((label, f"{mb:.1f}", f"{med * 1e3:.1f}", f"{mb / med:.0f}"))
    return rows, methods


# --- the conversation ------------------------------------------------------------------------


@dataclass(slots=True)
class Turn:
    ttft_s: float  # the completion's time to first token (from the gateway's acceptance)
    client_ttft_s: float  # seen by this client: call start to first chunk
    source: int
    prompt_tokens: int
    cached_tokens: int
    text: str
    token_ids: list[int]


def long_text(tokenizer: Tokenizer, template: str, target: int) -> str:
    """A varied log of made-up build notes whose chat prompt (with the three short questions
    and short replies of the later turns) takes at most `target` tokens."""
    parts = []
    for i in range(10_000):
        parts.append(
            f"Step {i}: module m{(i * 37) % 211} built in {(i * 7919) % 997} ms with "
            f"{(i * 31) % 17} warnings; cache key {(i * 2654435761) % 65536:04x}."
        )
    padding = [
        {"role": "assistant", "content": "word " * MAX_TOKENS},
        {"role": "user", "content": QUESTIONS[1]},
        {"role": "assistant", "content": "word " * MAX_TOKENS},
        {"role": "user", "content": QUESTIONS[2]},
    ]

    def size(n: int) -> int:
        content = " ".join(parts[:n]) + "\n\n" + QUESTIONS[0]
        messages = [{"role": "user", "content": content}, *padding]
        return len(tokenizer.encode(render_chat(template, messages)))

    lo, hi = 1, len(parts)
    while lo < hi:  # the most sentences that fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(mid) <= target else (lo, mid - 1)
    return " ".join(parts[:lo])


def turn(client: Client, session_id: str, messages: Messages) -> Turn:
    first: list[float] = []
    t = time.perf_counter()
    call = client.stream(session_id, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0)
    try:
        reply = collect(call, on_chunk=lambda _: first.append(time.perf_counter()))
    finally:
        call.cancel()
    c = reply.completion
    return Turn(
        c.timings.time_to_first_token_s,
        (first[0] if first else time.perf_counter()) - t,
        c.kv_source,
        c.usage.prompt_tokens,
        c.usage.cached_tokens,
        reply.text,
        reply.token_ids,
    )


def wait_for(client: Client, what: str, done: Callable[[list[pb.Session]], bool]) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not done(client.list_sessions()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def settle(client: Client) -> None:
    """Wait until the spill writes in flight are done: at most one session left in memory."""
    wait_for(
        client,
        "spills to finish",
        lambda ss: sum(s.tier in (pb.TIER_WARM, pb.TIER_HOT, pb.TIER_SPILLING) for s in ss) <= 1,
    )


def expect(t: Turn, source: int, what: str) -> None:
    got = SOURCE_NAMES.get(t.source, str(t.source))
    assert t.source == source, f"{what}: kv_source {got}, expected {SOURCE_NAMES[source]}"
    log(
        f"  {what}: {got}, {t.prompt_tokens} prompt tokens ({t.cached_tokens} cached), "
        f"ttft {t.ttft_s * 1e3:.1f} ms (client {t.client_ttft_s * 1e3:.1f} ms)"
    )


def run_repeat(
    client: Client, r: int, text: str, spill_dir: Path, methods: set[str], resident: list[int]
) -> dict[str, Turn]:
    a, b, c = f"kvt-{r}-a", f"kvt-{r}-b", f"kvt-{r}-c"
    m1: Messages = [{"role": "user", "content": f"{text}\n\n{QUESTIONS[0]}"}]
    log(f"repeat {r + 1}: session A, first turn (cold prefill)")
    t1 = turn(client, a, m1)
    expect(t1, pb.KV_SOURCE_COLD, "A turn 1")
    m2 = [*m1, {"role": "assistant", "content": t1.text}, {"role": "user", "content": QUESTIONS[1]}]
    warm = turn(client, a, m2)
    expect(warm, pb.KV_SOURCE_WARM, "A turn 2 (warm)")
    log("  session B, same size, pushes A out of the warm pool")
    m_b = [{"role": "user", "content": f"{text}\n\nB. {QUESTIONS[0]}"}]
    expect(turn(client, b, m_b), pb.KV_SOURCE_COLD, "B turn 1")
    wait_for(
        client,
        "session A on disk",
        lambda ss: any(s.session_id == a and s.tier == pb.TIER_DISK for s in ss),
    )
    settle(client)
    files = sorted(spill_dir.glob("*.wfkv"))
    methods.add(drop_page_cache(files))
    res = resident_bytes(files)
    if res is not None:
        resident.append(res)
    log(f"  page cache of {len(files)} spill file(s) dropped; {res} bytes still resident")
    m3 = [
        *m2,
        {"role": "assistant", "content": warm.text},
        {"role": "user", "content": QUESTIONS[2]},
    ]
    disk = turn(client, a, m3)
    expect(disk, pb.KV_SOURCE_DISK, "A turn 3 (disk)")
    settle(client)  # B goes to disk now
    cold = turn(client, c, m3)
    expect(cold, pb.KV_SOURCE_COLD, "C = A turn 3 under a new id (recompute)")
    if cold.token_ids != disk.token_ids:
        log(f"  NOTE: recomputed tokens {cold.token_ids} differ from disk's {disk.token_ids}")
    for s in (a, b, c):  # leaves an empty pool and no files for the next repeat
        client.delete_session(s)
    wait_for(client, "the sessions to go", lambda ss: not ss)
    return {"warm": warm, "disk": disk, "recompute": cold}


def ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e3:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--context", type=int, default=2000, help="tokens of the resumed prompt")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = resolve_model(args.model)
    meta = read_metadata(open_gguf(path))
    config, tokenizer = ModelConfig.from_metadata(meta), Tokenizer.from_metadata(meta)
    assert tokenizer.chat_template is not None, "the model has no chat template"
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * DTYPE_BYTES
    capacity = -(-(args.context + MAX_TOKENS) // GROW_TOKENS) * GROW_TOKENS
    session_bytes = capacity * per_token
    budget = 3 * session_bytes // 2  # one session fits, two do not
    log(
        f"KV: {per_token} bytes/token; a {args.context}-token session holds {capacity} "
        f"positions = {session_bytes / (1 << 20):.1f} MiB; warm budget {budget / (1 << 20):.1f} MiB"
    )

    log(f"spill files: {args.repeats} x write and read of a {args.context}-token KV")
    io_rows, io_methods = spill_throughput(config, args.context, args.repeats)

    text = long_text(tokenizer, tokenizer.chat_template, args.context)
    threads = os.cpu_count() or 1
    spill_dir = Path(tempfile.mkdtemp(prefix="wf-kvtiers-spill-"))
    methods: set[str] = set()
    resident: list[int] = []
    results: list[dict[str, Turn]] = []
    try:
        with (
            Cluster(
                num_workers=1,
                model=path,
                threads_per_worker=threads,
                progress=log,
                log_dir=os.environ.get("WARMFLEET_BENCH_LOGS") or None,
                spill_dir=spill_dir,
                warm_budget=budget,
            ) as cluster,
            Client(cluster.target, timeout_s=600) as client,
        ):
            warmup = [{"role": "user", "content": "Hello."}]
            turn(client, "kvt-warmup", warmup)  # first-call costs (Numba, gRPC) out of the way
            client.delete_session("kvt-warmup")
            for r in range(args.repeats):
                results.append(run_repeat(client, r, text, spill_dir, methods, resident))
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)

    def pick(kind: str, attr: str) -> list[float]:
        return [float(getattr(r[kind], attr)) for r in results]

    rec = statistics.median(pick("recompute", "ttft_s"))
    rows = []
    for kind in ("warm", "disk", "recompute"):
        ttft = pick(kind, "ttft_s")
        rows.append(
            (
                kind,
                SOURCE_NAMES[results[0][kind].source],
                f"{results[0][kind].prompt_tokens}",
                f"{results[0][kind].cached_tokens}",
                ms(ttft),
                f"{min(ttft) * 1e3:.1f}-{max(ttft) * 1e3:.1f}",
                ms(pick(kind, "client_ttft_s")),
                f"{rec / statistics.median(ttft):.1f}x",
            )
        )
    print(
        f"Time to first token on resume, 1 worker with {threads} threads, "
        f"median of {args.repeats}; page cache before the disk resume: {', '.join(sorted(methods))}"
        + (f" (spill files resident after the drop: max {max(resident)} bytes)" if resident else "")
    )
    print_table(
        (
            "path",
            "kv_source",
            "prompt tokens",
            "cached",
            "TTFT (ms)",
            "min-max (ms)",
            "client TTFT (ms)",
            "recompute / this",
        ),
        rows,
    )
    print()
    print(
        f"Spill files, one {args.context}-token float32 KV, median of {args.repeats}; "
        f"page cache: {', '.join(sorted(io_methods))}"
    )
    print_table(("operation", "MB", "time (ms)", "MB/s"), io_rows)
    warm, disk = (
        statistics.median(pick("warm", "ttft_s")),
        statistics.median(pick("disk", "ttft_s")),
    )
    print()
    print_table(
        ("target", "result", "holds"),
        [
            ("warm >= 50x faster than recompute", f"{rec / warm:.1f}x", _yes(rec / warm >= 50)),
            ("disk >= 10x faster than recompute", f"{rec / disk:.1f}x", _yes(rec / disk >= 10)),
            (
                "disk never slower than recompute",
                f"slowest disk {max(pick('disk', 'ttft_s')) * 1e3:.0f} ms, fastest recompute "
                f"{min(pick('recompute', 'ttft_s')) * 1e3:.0f} ms",
                _yes(max(pick("disk", "ttft_s")) < min(pick("recompute", "ttft_s"))),
            ),
        ],
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"


if __name__ == "__main__":
    main()
