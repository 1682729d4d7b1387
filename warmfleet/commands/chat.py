"""`warmfleet chat`: talk to a running warmfleet over gRPC in one sticky session."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from common.errors import InvalidRequestError
from common.v1 import inference_pb2 as pb
from warmfleet.client import Client, Reply, collect

DEFAULT_TARGET = "127.0.0.1:50051"
QUIT_COMMANDS = ("/quit", "/exit")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with a running warmfleet (gRPC) in one session; the whole conversation is "
        "resent each turn and the session's KV stays warm on its worker",
    )
    p.add_argument("--session", required=True, metavar="ID", help="the session id (sticky KV)")
    p.add_argument(
        "--target",
        default=os.environ.get("WARMFLEET_TARGET") or DEFAULT_TARGET,
        metavar="HOST:PORT",
        help=f"the gateway (default: $WARMFLEET_TARGET, else {DEFAULT_TARGET})",
    )
    p.add_argument("--system", metavar="TEXT", help="a system message to start with")
    p.add_argument(
        "--message",
        metavar="TEXT",
        help="send this one message, print the reply and exit (default: read turns from stdin)",
    )
    p.add_argument("--max-tokens", type=int, metavar="N", help="default: the server's (256)")
    p.add_argument("--temperature", type=float, metavar="T", help="default 0: greedy")
    p.add_argument("--seed", type=int, metavar="S")
    p.add_argument(
        "--api-key",
        default=os.environ.get("WARMFLEET_API_KEY") or None,
        metavar="KEY",
        help="sent as 'authorization: Bearer KEY' (default: $WARMFLEET_API_KEY); needed when "
        "the gateway has a key file",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="with --message: print one JSON object (text, token_ids, completion)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.json and args.message is None:
        raise InvalidRequestError("--json", "needs --message")
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    with Client(args.target, api_key=args.api_key) as client:
        if args.message is not None:
            return _one_turn(client, args, messages)
        return _repl(client, args, messages)


def _one_turn(client: Client, args: argparse.Namespace, messages: list[dict[str, str]]) -> int:
    messages.append({"role": "user", "content": args.message})
    try:
        reply = _send(client, args, messages, stream_text=not args.json)
    except grpc.RpcError as e:
        _print_error(e)
        return 2
    if args.json:
        result = {
            "session_id": args.session,
            "text": reply.text,
            "token_ids": reply.token_ids,
            "completion": MessageToDict(
                reply.completion,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            ),
        }
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(_describe(reply.completion), file=sys.stderr)
    return 0


def _repl(client: Client, args: argparse.Namespace, messages: list[dict[str, str]]) -> int:
    """Read turns from stdin until EOF or /quit. Ctrl-C during a reply cancels that turn only."""
    interactive = sys.stdin.isatty()
    if interactive:
        print(
            f"warmfleet chat: session {args.session} at {args.target} "
            f"({' or '.join(QUIT_COMMANDS)} or Ctrl-D to leave)",
            file=sys.stderr,
        )
    code = 0
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        text = line.strip()
        if not line or text in QUIT_COMMANDS:
            return code
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        try:
            reply = _send(client, args, messages, stream_text=True)
        except KeyboardInterrupt:
            messages.pop()  # the turn never happened; the next one resends the rest
            print("\n(cancelled)", file=sys.stderr)
            continue
        except grpc.RpcError as e:
            messages.pop()
            _print_error(e)
            code = 2
            continue
        messages.append({"role": "assistant", "content": reply.text})
        print(_describe(reply.completion), file=sys.stderr)


def _send(
    client: Client, args: argparse.Namespace, messages: list[dict[str, str]], *, stream_text: bool
) -> Reply:
    """One Generate call; its text goes to stdout as it arrives when `stream_text`."""
    call = client.stream(
        args.session,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
    )

    def show(chunk: pb.Chunk) -> None:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()

    try:
        reply = collect(call, on_chunk=show if stream_text else None)
    finally:
        call.cancel()  # a no-op once the call has ended; frees the worker on Ctrl-C
    if stream_text:
        sys.stdout.write("\n")
        sys.stdout.flush()
    return reply


def _describe(completion: pb.Completion) -> str:
    """One line about a reply: worker, where its KV came from, cache reuse and speed."""
    usage, kv_source = completion.usage, pb.KVSource.Name(completion.kv_source)
    reason = pb.FinishReason.Name(completion.finish_reason).removeprefix("FINISH_REASON_")
    return (
        f"[{completion.worker_id} · kv {kv_source.removeprefix('KV_SOURCE_').lower()} · "
        f"cached {usage.cached_tokens}/{usage.prompt_tokens} prompt tokens · "
        f"{usage.completion_tokens} tokens · {completion.timings.decode_tokens_per_s:.0f} tok/s"
        f" · {reason.lower()}]"
    )


def _print_error(e: grpc.RpcError) -> None:
    """One line: `warmfleet: error: CODE: details`."""
    code = e.code().name if hasattr(e, "code") else "UNKNOWN"
    details = e.details() if hasattr(e, "details") else str(e)
    print(f"warmfleet: error: {code}: {' '.join(str(details).split())}", file=sys.stderr)
