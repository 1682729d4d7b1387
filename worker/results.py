"""What a request's client receives from this worker: its chunks and its completion."""

from __future__ import annotations

import time

from broker.messages import Completion, Timings, Usage
from common.enums import KVSource
from engine import sequence
from worker.state import InFlight


def completion(f: InFlight, c: sequence.Completion, worker_id: str) -> Completion:
    """The engine's summary of a finished request, with the time it waited for a worker."""
    waited = f.admitted_at - f.job.accepted_at
    if c.cached_tokens == 0:
        source = KVSource.COLD
    elif c.prefix_tokens == c.cached_tokens:  # all from blocks other sessions computed
        source = KVSource.PREFIX
    else:
        source = KVSource.DISK if f.kv_from in ("disk", "shared") else KVSource.WARM
    return Completion(
        request_id=f.job.request_id,
        finish_reason=c.finish_reason,
        usage=Usage(c.prompt_tokens, c.cached_tokens, c.completion_tokens),
        timings=Timings(
            queue_wait_s=waited + c.queue_s,
            time_to_first_token_s=waited + c.ttft_s,
            decode_tokens_per_s=c.decode_tok_s,
            total_s=time.time() - f.job.accepted_at,
        ),
        worker_id=worker_id,
        kv_source=source,
        seed=c.seed,
        stop_sequence=c.stop_sequence,
    )
