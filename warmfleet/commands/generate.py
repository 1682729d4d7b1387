"""`warmfleet generate`: run one prompt through the in-process engine and stream the text."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from common.errors import InvalidRequestError
from common.sampling import SamplingParams
from engine.device import set_threads
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Completion, Request
from engine.text.chat import render_chat, validate_messages
from warmfleet.commands.common import add_compute
from warmfleet.models import resolve_model
from warmfleet.sizes import format_size


def register(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text with the in-process engine")
    p.add_argument(
        "--model",
        metavar="PATH",
        help="a GGUF file of a llama, qwen2, qwen3, qwen3moe or gpt-oss model (default: the "
        "default model, fetched first)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", metavar="TEXT", help="raw text, sent without a chat template")
    src.add_argument(
        "--messages",
        metavar="JSON",
        help="chat messages as JSON, e.g. "
        '\'[{"role": "user", "content": "Hi"}]\', or @FILE to read them from a file',
    )
    p.add_argument("--max-tokens", type=int, default=256, metavar="N")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 is off")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="1 is off")
    p.add_argument("--min-p", type=float, default=0.0, metavar="P", help="0 is off")
    p.add_argument("--seed", type=int, default=None, metavar="S")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop before this text (repeatable)",
    )
    p.add_argument("--ignore-eos", action="store_true", help="never end at the end-of-turn token")
    p.add_argument(
        "--min-tokens", type=int, default=0, metavar="N",
        help="no end-of-turn token before N tokens",
    )  # fmt: skip
    add_compute(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object at the end instead of streaming text",
    )
    p.set_defaults(run=run)


def parse_messages(raw: str) -> list[dict[str, str]]:
    if raw.startswith("@"):
        try:
            with open(raw[1:], encoding="utf-8") as f:
                raw = f.read()
        except OSError as e:
            raise InvalidRequestError("messages", f"cannot read {raw[1:]}: {e.strerror}") from e
    try:
        messages = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidRequestError("messages", f"not valid JSON: {e.msg} at char {e.pos}") from e
    validate_messages(messages)
    return messages


def run(args: argparse.Namespace) -> int:
    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        ignore_eos=args.ignore_eos,
        min_tokens=args.min_tokens,
    )
    messages = parse_messages(args.messages) if args.messages is not None else None
    set_threads(args.threads)
    path = resolve_model(args.model)
    t0 = time.perf_counter()
    print(f"warmfleet: loading {path.name}", file=sys.stderr, flush=True)
    model = Model.load(
        path, device=args.device, dtype=args.dtype, weights=args.weights, kv_dtype=args.kv_dtype
    )
    load_s = time.perf_counter() - t0
    print(f"warmfleet: loaded in {load_s:.1f} s ({model.device}, {args.dtype}, weights "
          f"{model.weights_mode}: {format_size(model.weight_bytes)})", file=sys.stderr,
          flush=True)  # fmt: skip
    tok = model.tokenizer
    if messages is not None:
        if tok.chat_template is None:
            raise InvalidRequestError("messages", "this model has no chat template; use --prompt")
        text = render_chat(tok.chat_template, messages)
    else:
        text = args.prompt
    request = Request("cli", tok.encode(text), sampling)
    token_ids, pieces, completion = _generate(Engine(model), request, stream=not args.json)
    if args.json:
        print(json.dumps(_summary(model, request, token_ids, "".join(pieces), completion, load_s),
                         ensure_ascii=False))  # fmt: skip
    return 0


def _generate(
    engine: Engine, request: Request, *, stream: bool
) -> tuple[list[int], list[str], Completion]:
    """Run the request to its end, writing its text to stdout as it comes when `stream`."""
    engine.add(request)
    token_ids: list[int] = []
    pieces: list[str] = []
    completion = None
    while completion is None:
        for out in engine.step():
            token_ids += out.token_ids
            pieces.append(out.text)
            completion = out.completion
            if stream:
                sys.stdout.write(out.text)
                sys.stdout.flush()
    if stream:
        sys.stdout.write("\n")
    return token_ids, pieces, completion


def _summary(
    model: Model,
    request: Request,
    token_ids: list[int],
    text: str,
    completion: Completion,
    load_s: float,
) -> dict[str, object]:
    """What --json prints."""
    return {
        "model": str(model.path),
        "fingerprint": model.fingerprint,
        "device": model.device,
        "weights": model.weights_mode,
        "weight_bytes": model.weight_bytes,
        "prompt_ids": request.prompt_ids,
        "token_ids": token_ids,
        "text": text,
        "finish_reason": str(completion.finish_reason),
        "seed": completion.seed,
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
        },
        "timings": {
            "load_s": round(load_s, 3),
            "ttft_s": round(completion.ttft_s, 4),
            "total_s": round(completion.total_s, 4),
            "decode_tok_s": round(completion.decode_tok_s, 2),
        },
    }
