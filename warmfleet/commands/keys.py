"""`warmfleet keys add`: make an API key for a tenant and add it, hashed, to a key file."""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from common.enums import PRIORITIES
from common.errors import InvalidRequestError
from common.ids import TENANT_NAME
from gateway.auth import KeyRing, hash_key


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="manage the gateway's API keys (a TOML file of hashed keys)")
    actions = p.add_subparsers(dest="action", required=True)
    add = actions.add_parser(
        "add",
        help="make a new key for a tenant, append its sha256 to the file (created 0600 if "
        "missing) and print the key once: it is not stored in clear anywhere",
    )
    add.add_argument("--file", required=True, metavar="FILE", help="the key file (--keys)")
    add.add_argument("--tenant", required=True, help="1-64 of A-Z a-z 0-9 _ . -")
    add.add_argument(
        "--max-priority",
        choices=PRIORITIES,
        default="normal",
        help="the highest class this key may ask for (normal)",
    )
    for name, default, meaning in (
        ("--weight", 1, "share of the workers within a class"),
        ("--max-concurrent", 16, "requests running at once"),
        ("--max-queued", 64, "requests waiting"),
    ):
        help_text = f"{meaning} ({default})"
        add.add_argument(name, type=int, default=default, metavar="N", help=help_text)
    add.add_argument(
        "--admin",
        action="store_true",
        help="an operator's key: it may open the dashboard and evict sessions or drain "
        "workers from it",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not TENANT_NAME.match(args.tenant):
        raise InvalidRequestError("--tenant", "1-64 of A-Z a-z 0-9 _ . -")
    for name in ("weight", "max_concurrent", "max_queued"):
        if getattr(args, name) < 1:
            raise InvalidRequestError(f"--{name.replace('_', '-')}", "must be at least 1")
    path = Path(args.file)
    key = f"wf_{secrets.token_urlsafe(24)}"
    entry = (
        "\n[[keys]]\n"
        f'sha256 = "{hash_key(key)}"\n'
        f'tenant = "{args.tenant}"\n'
        f'max_priority = "{args.max_priority}"\n'
        f"weight = {args.weight}\n"
        f"max_concurrent = {args.max_concurrent}\n"
        f"max_queued = {args.max_queued}\n" + ("admin = true\n" if args.admin else "")
    )
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(entry)
    try:
        KeyRing.load(path)  # the file as a whole must still be valid
    except InvalidRequestError:
        path.write_text(old, encoding="utf-8")
        raise
    print(key)
    print(f"warmfleet: added a key for tenant {args.tenant!r} to {path}", file=sys.stderr)
    return 0
