"""Engine benchmark: prefill and batched decode speed on each device asked for, side by side.

On the real model: cpu (NumPy and the C kernels) against its memory-bandwidth floor and,
where llama-cpp-python is installed, against llama.cpp; mlx (engine/mlx_backend) against cpu.

    .venv/bin/python -m bench.engine [--model PATH] [--device cpu,mlx] [--threads N]
                                     [--repeats R] [--mlx-repeats R] [--prompt-tokens N]
                                     [--decode-tokens N] [--batches 1,4,8,16]
                                     [--weights auto|quantized|float32] [--no-llamacpp]

Prints a table; every ratio is taken within the same run (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from bench.engine_measure import (
    Bandwidth,
    Figures,
    Loaded,
    Workload,
    best_of,
    load,
    log,
    make_workload,
    measure,
    measure_bandwidth,
    measure_reference,
    warm_up,
)
from bench.engine_rows import Notes, describe, floor_lines, memory_lines, speed_lines, table
from bench.table import print_table
from engine.device import set_threads
from engine.loader.weights import WEIGHT_MODES
from warmfleet.models import resolve_model

DEVICES = ("cpu", "mlx")  # the table's column order
PROMPT_TOKENS = 512
DECODE_TOKENS = 128
BATCHES = (1, 4, 8, 16)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument(
        "--device",
        action="append",
        metavar="cpu|mlx[,...]",
        help="the devices to measure, repeated or a comma list (default: cpu)",
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of cpu (and llama.cpp); each figure is the best of its rounds",
    )
    parser.add_argument(
        "--mlx-repeats",
        type=int,
        metavar="R",
        help="rounds of mlx (default: --repeats); on MLX's Linux CPU build one "
        "round of the default workload takes about 8 minutes",
    )
    add_workload_options(parser)
    parser.add_argument("--weights", choices=WEIGHT_MODES, default="auto")
    parser.add_argument(
        "--no-llamacpp",
        action="store_true",
        help="skip llama.cpp even where llama-cpp-python is installed",
    )
    return parser


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    """The options that shape what every device runs: the prompt, the decode, the batches."""
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=PROMPT_TOKENS,
        metavar="N",
        help="the prefill's prompt, on every device",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=DECODE_TOKENS,
        metavar="N",
        help="tokens each decoding sequence makes, on every device",
    )
    parser.add_argument(
        "--batches",
        action="append",
        metavar="B[,...]",
        help="decode batch sizes (default: 1,4,8,16)",
    )


@dataclass(frozen=True, slots=True)
class Plan:
    """What the checked options ask for."""

    devices: list[str]  # in the table's column order
    batches: tuple[int, ...]  # sorted, 1 first
    rounds: dict[str, int]  # by device


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Plan:
    """The devices, batch sizes and rounds the options ask for; exits on a bad option."""
    asked = parse_list(args.device, ["cpu"])
    if unknown := sorted(set(asked) - set(DEVICES)):
        parser.error(f"--device: {', '.join(unknown)} is not one of {', '.join(DEVICES)}")
    devices = [d for d in DEVICES if d in asked]
    try:
        batches = tuple(sorted({int(b) for b in parse_list(args.batches, ["1,4,8,16"])}))
    except ValueError:
        parser.error("--batches: whole numbers, e.g. 1,4,8,16")
    if min(args.repeats, args.mlx_repeats or 1) < 1:
        parser.error("--repeats and --mlx-repeats: at least 1")
    if batches[0] != 1:
        parser.error("--batches must include 1 (the step time and its floor)")
    if args.prompt_tokens < batches[-1] + 15:
        parser.error(f"--prompt-tokens: at least {batches[-1] + 15} for batch {batches[-1]}")
    rounds = {"cpu": args.repeats, "mlx": args.mlx_repeats or args.repeats}
    return Plan(devices, batches, rounds)


def parse_list(values: list[str] | None, default: list[str]) -> list[str]:
    """Repeated options and comma lists, as one list."""
    return [v.strip() for arg in values or default for v in arg.split(",") if v.strip()]


def run_rounds(
    loaded: dict[str, Loaded],
    work: Workload,
    rounds: dict[str, int],
    reference: Path | None,
    threads: int,
) -> tuple[dict[str, Figures], Bandwidth | None, dict[str, float]]:
    """Each device's figures, the CPU cores' bandwidth where cpu ran, and llama.cpp's figures
    on `reference` (None: not measured), each the best of its rounds."""
    # rounds alternate between the devices and llama.cpp, and each figure is the best of its
    # rounds: this machine's speed drifts by up to 2x over minutes, which one long run of
    # each would turn into a false ratio
    figures: dict[str, Figures] = {}
    bw: Bandwidth | None = None
    lc: dict[str, float] = {}
    devices = list(loaded)
    for r in range(max(rounds[d] for d in devices)):
        log(f"round {r + 1}")
        if "cpu" in devices and r < rounds["cpu"]:
            bw = measure_bandwidth().best(bw)
        for d in devices:
            if r < rounds[d]:
                figures[d] = measure(loaded[d].model, work).best(figures.get(d))
        if reference is not None and r < rounds["cpu"]:
            lc = best_of(lc, measure_reference(reference, work, threads))
    return figures, bw, lc


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    plan = check_options(parser, args)
    devices, rounds = plan.devices, plan.rounds

    threads = set_threads(args.threads)
    path = resolve_model(args.model)
    loaded = {d: load(path, d, args.weights) for d in devices}
    first = loaded[devices[0]].model
    work = make_workload(first, args.prompt_tokens, args.decode_tokens, plan.batches)
    for one in loaded.values():
        log(f"{one.device}: warming up")
        warm_up(one.model, work.prompt_ids)

    use_lc = "cpu" in devices and not args.no_llamacpp
    figures, bw, lc = run_rounds(loaded, work, rounds, path if use_lc else None, threads)
    notes = Notes()
    lines = [*speed_lines(figures, lc, work), *floor_lines(loaded, figures, bw, notes)]
    lines += memory_lines(loaded, lc, path.stat().st_size, args.prompt_tokens, notes)
    print(describe(devices, threads, rounds, path))
    print_table(*table(lines, devices))
    notes.print()


if __name__ == "__main__":
    main()
