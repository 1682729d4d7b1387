"""Every Redis key and stream name warmfleet uses, in one place (prefix `wf:`)."""

from __future__ import annotations

GROUP = "workers"  # the consumer group on every request stream
DEFAULT_TENANT = "local"
NO_KEY = "wf:none"  # stands in for a key a script is given but must not find (no session)

WORKERS = "wf:workers"  # set of worker ids that have registered

KV_EVENTS = "wf:kv:events"  # stream: workers' session events and commands, for the kvstore
KV_GROUP = "kvstore"  # the consumer group on KV_EVENTS
KV_STATS = "wf:kv:stats"  # hash: the kvstore's counters (spills, restores, rejected files...)
KV_USAGE = "wf:kv:usage"  # the kvstore's GetUsage report as JSON, renewed twice a second
# string: the id of the last KV_EVENTS entry the kvstore applied, moved in the transaction
# that applies it (a kvstore whose picture is older writes nothing: no event applied twice)
KV_APPLIED = "wf:kv:applied"
STATS = "wf:stats"  # hash: the gateways' counters (admitted, refused, responses by status)


def pinned_stream(worker_id: str) -> str:
    """Requests routed to one worker because it holds the session's KV."""
    return f"wf:q:worker:{worker_id}"


WAKE = "wf:wake"  # stream: an entry per request queued, for idle workers to wake on


def worker_wake(worker_id: str) -> str:
    """Stream: an entry when another worker leaves a queued request to this one (the least
    loaded), so that it dispatches now rather than when its wait ends."""
    return f"wf:wake:{worker_id}"


QUEUED = "wf:queued"  # count of requests in the fair queues, all tenants
RUNNING = "wf:running"  # hash: each tenant's requests taken by a worker and not yet ended


def fair_queue(priority: str, tenant: str) -> str:
    """List: one tenant's queued request ids of one class, oldest first."""
    return f"wf:fq:{priority}:{tenant}"


def fair_active(priority: str) -> str:
    """Sorted set: the tenants with queued requests of one class, by virtual start time."""
    return f"wf:fq:{priority}"


def fair_state(priority: str) -> str:
    """Hash: the class's virtual clock ("~clock") and each tenant's virtual finish time."""
    return f"wf:fq:{priority}:vt"


def fair_charge(request_id: str) -> str:
    """Hash: what the fair queues charged a dispatched request (class keys, tenant, cost,
    weight), refunded in part when it ends having used less (expires an hour after its
    deadline)."""
    return f"wf:charge:{request_id}"


def queued_request(request_id: str) -> str:
    """Hash: a queued request's body (b), cost (c), weight (w), its tenant's running bound
    (m) and the worker holding its session, if one does (h); it expires at its deadline."""
    return f"wf:req:{request_id}"


def tenant_queued(tenant: str) -> str:
    """Count of one tenant's requests in the fair queues."""
    return f"wf:queued:{tenant}"


def out_stream(request_id: str) -> str:
    """Tokens of one request, from the worker back to the gateway."""
    return f"wf:out:{request_id}"


def hub_wake(hub_id: str) -> str:
    """Stream: an entry when a gateway's results reader has a new stream to read."""
    return f"wf:hub:{hub_id}:wake"


def cancel_key(request_id: str) -> str:
    """Present while a client has cancelled the request."""
    return f"wf:cancel:{request_id}"


def heartbeat_key(worker_id: str) -> str:
    """Present (with a TTL) while the worker is alive; its value is the worker's status."""
    return f"wf:hb:{worker_id}"


def draining_key(worker_id: str) -> str:
    """Present while the worker drains: it is routed no new request."""
    return f"wf:draining:{worker_id}"


KVSTORE_HEARTBEAT = "wf:kvstore:hb"  # present (with a TTL) while the kvstore runs


def affinity_key(tenant: str, session_id: str) -> str:
    """The worker that last started a request of the session (written by that worker, so
    a follow-up turn finds it even before the kvstore has applied the worker's event)."""
    return f"wf:affinity:{tenant}:{session_id}"


def adopt_lock(worker_id: str) -> str:
    """Held by the live worker that takes over a dead worker's pinned stream."""
    return f"wf:adopt:{worker_id}"


def session_key(tenant: str, session_id: str) -> str:
    """Hash: where a session's KV lives (worker, tier, tokens, bytes, last use)."""
    return f"wf:session:{tenant}:{session_id}"


def session_prefix() -> str:
    """What every session hash's key starts with (for scanning the index)."""
    return "wf:session:"


def parse_session_key(name: str) -> tuple[str, str]:
    """(tenant, session id) of a session hash's key (tenant names hold no ':')."""
    tenant, _, session_id = name.removeprefix(session_prefix()).partition(":")
    return tenant, session_id


TENANTS = "wf:tenants"  # set: the tenants that have had a session (for listing them all)


def session_index(tenant: str) -> str:
    """Sorted set of a tenant's session ids, scored by last use (for listing)."""
    return f"wf:sessions:{tenant}"


def cache_key(tenant: str, session_id: str) -> str:
    """The engine's key for a session's KV: tenant-scoped, so ids never collide."""
    return f"{tenant}/{session_id}"


def split_cache_key(key: str) -> tuple[str, str]:
    """(tenant, session id) of a cache key."""
    tenant, session_id = key.split("/", 1)
    return tenant, session_id


def reply_key(token: str) -> str:
    """List that receives the one answer to a command sent on KV_EVENTS."""
    return f"wf:reply:{token}"
