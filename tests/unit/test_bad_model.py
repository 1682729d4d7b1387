"""Bad model files and bad CLI input: a named error in the library, one line and exit 2 in the
CLI, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.errors import ModelNotFoundError, NotGGUFError, UnsupportedModelError
from engine.model import Model
from tests.tiny_gguf import write_tiny_llama

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Good and bad model files, by name."""
    d = tmp_path_factory.mktemp("bad")
    good = write_tiny_llama(d / "good.gguf")
    data = good.read_bytes()
    out = {
        "good": good,
        "missing": d / "no-such-model.gguf",
        "directory": d,
        "random": d / "random.bin",
        "empty": d / "empty.gguf",
        "magic-only": d / "magic-only.gguf",
        "truncated-half": d / "half.gguf",
        "truncated-header": d / "header.gguf",
        "truncated-last-byte": d / "last-byte.gguf",
        "gpt2": write_tiny_llama(d / "gpt2.gguf", arch="gpt2"),
        "no-ffn-up": write_tiny_llama(d / "no-ffn-up.gguf", drop_tensor="blk.1.ffn_up.weight"),
        "no-embedding": write_tiny_llama(d / "no-embd.gguf", drop_tensor="token_embd.weight"),
        "no-context": write_tiny_llama(d / "no-ctx.gguf", metadata={"context_length": None}),
        "bad-heads": write_tiny_llama(d / "heads.gguf", metadata={"attention.head_count": 3}),
        "bad-vocab": write_tiny_llama(d / "vocab.gguf", metadata={"vocab_size": 300}),
        "spm-tokenizer": write_tiny_llama(d / "spm.gguf", tokenizer_model="llama"),
        "kv-heads-vs-tensor": write_tiny_llama(
            d / "kvh.gguf", metadata={"attention.head_count_kv": 4}
        ),
        "ffn-vs-tensor": write_tiny_llama(d / "ffn.gguf", metadata={"feed_forward_length": 96}),
        "no-layers": write_tiny_llama(d / "nolayers.gguf", metadata={"block_count": 0}),
        "zero-context": write_tiny_llama(d / "ctx0.gguf", metadata={"context_length": 0}),
        "short-context": write_tiny_llama(d / "ctx64.gguf", context_length=64),
    }
    out["random"].write_bytes(np.random.default_rng(0).bytes(4096))
    out["empty"].write_bytes(b"")
    out["magic-only"].write_bytes(b"GGUF")
    out["truncated-half"].write_bytes(data[: len(data) // 2])
    out["truncated-header"].write_bytes(data[:100])
    out["truncated-last-byte"].write_bytes(data[:-1])
    return out


LIBRARY_ERRORS: list[tuple[str, type[Exception], list[str]]] = [
    ("missing", ModelNotFoundError, ["no-such-model.gguf"]),
    ("directory", ModelNotFoundError, ["not found"]),
    ("random", NotGGUFError, ["random.bin", "not a GGUF file"]),
    ("empty", NotGGUFError, ["not a GGUF file"]),
    ("magic-only", NotGGUFError, ["malformed"]),
    ("truncated-half", NotGGUFError, ["half.gguf"]),
    ("truncated-header", NotGGUFError, ["header.gguf"]),
    ("truncated-last-byte", NotGGUFError, ["last-byte.gguf"]),
    ("gpt2", UnsupportedModelError, ["'gpt2'", "llama"]),
    ("no-ffn-up", UnsupportedModelError, ["blk.1.ffn_up.weight"]),
    ("no-embedding", UnsupportedModelError, ["token_embd.weight"]),
    ("no-context", UnsupportedModelError, ["llama.context_length"]),
    ("bad-heads", UnsupportedModelError, ["head_count"]),
    ("bad-vocab", UnsupportedModelError, ["300"]),
    ("spm-tokenizer", UnsupportedModelError, ["tokenizer.ggml.model", "'llama'"]),
    ("kv-heads-vs-tensor", UnsupportedModelError, ["blk.0.attn_k.weight", "shape"]),
    ("ffn-vs-tensor", UnsupportedModelError, ["blk.0.ffn_gate.weight", "shape"]),
    ("no-layers", UnsupportedModelError, ["num_layers"]),
    ("zero-context", UnsupportedModelError, ["context_length"]),
]


@pytest.mark.parametrize(
    ("name", "error", "words"), LIBRARY_ERRORS, ids=[c[0] for c in LIBRARY_ERRORS]
)
def test_library_raises_a_named_error(
    files: dict[str, Path], name: str, error: type[Exception], words: list[str]
) -> None:
    with pytest.raises(error) as err:
        Model.load(files[name], device="cpu")
    assert type(err.value) is error
    for word in words:
        assert word in str(err.value)


def test_good_file_loads(files: dict[str, Path]) -> None:
    model = Model.load(files["good"], device="cpu")
    assert model.config.num_layers == 2 and model.config.context_length == 256
    assert model.tokenizer.eos_id == 2 and model.tokenizer.eot_ids == {0, 2}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "warmfleet.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def assert_one_error_line(done: subprocess.CompletedProcess[str], prefix: str) -> str:
    """Exit 2, nothing on stdout, and stderr is progress lines then exactly one error line."""
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines and lines[-1].startswith(prefix), done.stderr
    assert all(line.startswith("warmfleet") for line in lines), done.stderr
    assert sum("error:" in line for line in lines) == 1, done.stderr
    return lines[-1]


CLI_FILE_ERRORS = ["missing", "random", "empty", "truncated-half", "gpt2", "no-ffn-up"]


@pytest.mark.parametrize("name", CLI_FILE_ERRORS)
def test_cli_bad_model_file(files: dict[str, Path], name: str) -> None:
    done = cli("generate", "--model", str(files[name]), "--prompt", "hi", "--device", "cpu")
    line = assert_one_error_line(done, "warmfleet: error: ")
    words = dict((n, w) for n, _, w in LIBRARY_ERRORS)[name]
    assert all(word in line for word in words), line


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--top-p", "0"], "top_p"),
        (["--temperature", "-1"], "temperature"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--stop", ""], "stop"),
    ],
)
def test_cli_invalid_sampling(files: dict[str, Path], args: list[str], field: str) -> None:
    done = cli("generate", "--model", str(files["good"]), "--prompt", "hi", *args)
    assert_one_error_line(done, f"warmfleet: error: {field}: ")
    assert "loading" not in done.stderr  # checked before the model is read


@pytest.mark.parametrize(
    ("messages", "words"),
    [
        ('[{"role": "user", "content": "hi"', ["messages: not valid JSON"]),
        ('[{"role": "wizard", "content": "hi"}]', ["messages: [0].role", "'wizard'"]),
        ("@/nonexistent/messages.json", ["messages: cannot read"]),
    ],
)
def test_cli_invalid_messages(files: dict[str, Path], messages: str, words: list[str]) -> None:
    done = cli("generate", "--model", str(files["good"]), "--messages", messages)
    line = assert_one_error_line(done, "warmfleet: error: messages: ")
    assert all(word in line for word in words), line


@pytest.mark.parametrize(
    "args",
    [["generate", "--model", "x.gguf"], ["generate", "--prompt", "hi", "--max-tokens", "ten"]],
)
def test_cli_usage_errors(args: list[str]) -> None:
    line = assert_one_error_line(cli(*args), "warmfleet generate: error: ")
    assert line.endswith("(see --help)")


def test_cli_prompt_longer_than_the_context(files: dict[str, Path]) -> None:
    done = cli(
        "generate",
        "--model",
        str(files["short-context"]),
        "--prompt",
        "ab " * 40,
        "--device",
        "cpu",
    )
    line = assert_one_error_line(done, "warmfleet: error: prompt: ")
    assert "context of 64 tokens" in line
    assert "warmfleet: loading ctx64.gguf" in done.stderr


def test_cli_runs_the_good_file(files: dict[str, Path]) -> None:
    """The control: the same command line with a good file succeeds."""
    done = cli(
        "generate",
        "--model",
        str(files["good"]),
        "--prompt",
        "the cat",
        "--device",
        "cpu",
        "--max-tokens",
        "4",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["token_ids"]) == 4 and result["finish_reason"] == "length"
    model = Model.load(files["good"], device="cpu")
    assert result["prompt_ids"] == model.tokenizer.encode("the cat")
    assert (result["weights"], result["weight_bytes"]) == (model.weights_mode, model.weight_bytes)
    assert result["usage"] == {"prompt_tokens": len(result["prompt_ids"]), "completion_tokens": 4}
