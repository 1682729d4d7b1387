"""API keys and tenants: `authorization: Bearer KEY` names a tenant, from a TOML key file.

The file stores keys hashed (sha256), never in clear:

    [[keys]]
    sha256 = "9f86d081884c7d65..."   # `warmfleet keys add` writes these entries
    tenant = "alice"
    max_priority = "normal"           # interactive, normal or batch (default normal)
    weight = 2                        # share of the workers within a class (default 1)
    max_concurrent = 8                # requests running at once (default 16)
    max_queued = 32                   # requests waiting (default 64)
    admin = true                      # may use the dashboard and its actions (default false)

Several keys may name one tenant; they must then agree on its settings (`admin` is the
key's own: an operator's key and an agent's key may share a tenant). Without a key file
every caller is the single local tenant, with every priority, and an admin; its limits are
the gateway's flags --local-max-concurrent (16) and --local-max-queued (64).
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.keys import DEFAULT_TENANT
from common.enums import PRIORITIES, Priority
from common.errors import InvalidRequestError, PermissionDeniedError, UnauthenticatedError
from common.ids import TENANT_NAME

BEARER = "bearer "


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    max_priority: Priority = Priority.INTERACTIVE  # the highest class it may ask for
    weight: int = 1
    max_concurrent: int = 16
    max_queued: int = 64
    local: bool = False  # the one tenant of a gateway without keys (its limits are flags)

    def allows(self, priority: Priority) -> bool:
        """Whether this tenant may send requests of class `priority`."""
        return PRIORITIES.index(priority) >= PRIORITIES.index(self.max_priority)


LOCAL = Tenant(DEFAULT_TENANT, local=True)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Maps API keys (by their sha256) to tenants."""

    def __init__(
        self,
        by_hash: dict[str, Tenant],
        admins: frozenset[str] = frozenset(),
        local: Tenant = LOCAL,
    ) -> None:
        self._by_hash = by_hash
        self._admins = admins  # the hashes of the keys with `admin = true`
        self._local = local  # every caller's tenant when there are no keys

    @property
    def enabled(self) -> bool:
        return bool(self._by_hash)

    @property
    def tenants(self) -> list[str]:
        return sorted({t.name for t in self._by_hash.values()})

    @classmethod
    def open(cls, max_concurrent: int = LOCAL.max_concurrent,
             max_queued: int = LOCAL.max_queued) -> KeyRing:  # fmt: skip
        """No keys: every caller is the local tenant, with these limits (--local-max-*)."""
        local = Tenant(DEFAULT_TENANT, max_concurrent=max_concurrent, max_queued=max_queued,
                       local=True)  # fmt: skip
        return cls({}, local=local)

    @classmethod
    def load(cls, path: str | Path) -> KeyRing:
        """Read a key file; InvalidRequestError naming the file and the entry otherwise."""
        name = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise InvalidRequestError("--keys", f"cannot read {name}: {e.strerror}") from e
        except tomllib.TOMLDecodeError as e:
            raise InvalidRequestError("--keys", f"{name} is not valid TOML: {e}") from e
        entries = data.get("keys")
        if not isinstance(entries, list) or not entries:
            raise InvalidRequestError("--keys", f"{name} has no [[keys]] entries")
        by_hash: dict[str, Tenant] = {}
        by_name: dict[str, Tenant] = {}
        admins: set[str] = set()
        for i, entry in enumerate(entries, 1):
            where = f"{name}, key {i}"
            digest, tenant, admin = _entry(entry, where)
            if admin:
                admins.add(digest)
            if digest in by_hash:
                raise InvalidRequestError("--keys", f"{where}: the same key is listed twice")
            if by_name.setdefault(tenant.name, tenant) != tenant:
                raise InvalidRequestError(
                    "--keys", f"{where}: tenant {tenant.name!r} has other settings elsewhere"
                )
            by_hash[digest] = tenant
        return cls(by_hash, frozenset(admins))

    def tenant(self, metadata: Sequence[tuple[str, str | bytes]]) -> Tenant:
        """The caller's tenant from its `authorization` metadata (UnauthenticatedError)."""
        values = [v for k, v in metadata if k == "authorization"]
        value = values[0] if values else None
        return self.tenant_of(value.decode() if isinstance(value, bytes) else value)

    def tenant_of(self, authorization: str | None, api_key: str | None = None) -> Tenant:
        """The caller's tenant from 'Bearer KEY' (OpenAI clients, gRPC) or a bare key
        (Anthropic clients' x-api-key); UnauthenticatedError without a known key."""
        return self._caller(authorization, api_key)[0]

    def admin_of(self, authorization: str | None, api_key: str | None = None) -> Tenant:
        """`tenant_of` for operator calls (the dashboard): PermissionDeniedError unless the
        key is an admin key (every caller is, without a key file)."""
        tenant, digest = self._caller(authorization, api_key)
        if self._by_hash and digest not in self._admins:
            raise PermissionDeniedError(
                "this key is not an admin key (add `admin = true` to its entry in the key file)"
            )
        return tenant

    def _caller(self, authorization: str | None, api_key: str | None) -> tuple[Tenant, str]:
        """The caller's tenant and its key's hash ("" without a key file)."""
        if not self._by_hash:
            return self._local, ""
        if api_key is None:
            if authorization is None:
                raise UnauthenticatedError(
                    "missing 'authorization: Bearer KEY' (or 'x-api-key: KEY')"
                )
            if not authorization.lower().startswith(BEARER) or not authorization[7:].strip():
                raise UnauthenticatedError("authorization must be 'Bearer KEY'")
            api_key = authorization[len(BEARER) :]
        digest = hash_key(api_key.strip())
        tenant = self._by_hash.get(digest) if api_key.strip() else None
        if tenant is None:
            raise UnauthenticatedError("unknown API key")
        return tenant, digest


def _entry(entry: Any, where: str) -> tuple[str, Tenant, bool]:
    """An entry's key hash, its tenant, and whether it is an admin key."""
    if not isinstance(entry, dict):
        raise InvalidRequestError("--keys", f"{where}: not a table")
    unknown = set(entry) - {
        "sha256", "tenant", "max_priority", "weight", "max_concurrent", "max_queued", "admin"
    }  # fmt: skip
    if unknown:
        raise InvalidRequestError("--keys", f"{where}: unknown field(s) {sorted(unknown)}")
    digest = entry.get("sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise InvalidRequestError("--keys", f"{where}: sha256 must be 64 lowercase hex digits")
    name = entry.get("tenant")
    if not isinstance(name, str) or not TENANT_NAME.match(name):
        raise InvalidRequestError(
            "--keys", f"{where}: tenant must be 1-64 of A-Z a-z 0-9 _ . - (got {name!r})"
        )
    priority = entry.get("max_priority", "normal")
    if priority not in PRIORITIES:
        raise InvalidRequestError(
            "--keys", f"{where}: max_priority must be one of {', '.join(PRIORITIES)}"
        )
    numbers = {}
    for field, default in (("weight", 1), ("max_concurrent", 16), ("max_queued", 64)):
        value = entry.get(field, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidRequestError("--keys", f"{where}: {field} must be an integer >= 1")
        numbers[field] = value
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise InvalidRequestError("--keys", f"{where}: admin must be true or false")
    tenant = Tenant(name, Priority(priority), numbers["weight"], numbers["max_concurrent"],
                    numbers["max_queued"])  # fmt: skip
    return digest, tenant, admin
