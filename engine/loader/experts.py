"""A mixture-of-experts layer's tensors: the router, and the 3-D expert tensors viewed in
place in the file's memory map (engine/ops/quant/experts.py); and what such a file may ask
that the engine does not build, refused by name at load (left out, it would make the output
wrong)."""

from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np

from common.errors import UnsupportedModelError
from engine.ops.quant.experts import EXPERT_TYPES, ExpertMatrix
from engine.ops.quant.experts_native import packed
from engine.text.gguf_file import release_pages
from engine.text.model_config import ModelConfig

EXPERT_KINDS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
SOFTMAX_GATING, CHOSEN_SOFTMAX_GATING = 1, 3  # llama.cpp's expert_gating_func values
GATING = {0: "no", 1: "a softmax", 2: "a sigmoid", 3: "a softmax-over-the-chosen"}
BIAS_TENSORS = ("_exps.bias", "ffn_gate_inp.bias")  # what gpt-oss's experts have
# tensors of MoE variants the engine does not build, by what a name holds
UNBUILT_TENSORS = (
    ("shexp", "shared experts"),
    ("exp_probs_b", "expert selection biases (biased routing)"),
    ("_exps.bias", "expert biases"),
    ("ffn_gate_inp.bias", "router biases"),
)


def expert_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The numpy shape of each expert tensor kind (none for a dense model)."""
    if not c.num_experts:
        return {}
    e, f = c.num_experts, c.expert_ffn_dim
    return {
        "ffn_gate_inp": (e, c.dim),
        "ffn_gate_exps": (e, f, c.dim),
        "ffn_up_exps": (e, f, c.dim),
        "ffn_down_exps": (e, c.dim, f),
    }


def refuse_unbuilt(
    meta: dict[str, Any], tensor_names: list[str], has_experts: bool, gpt_oss: bool = False
) -> None:
    """UnsupportedModelError naming the first thing the file asks that is not built: an
    MoE variant (shared experts, grouped or sigmoid routing, expert biases, scaled or
    unnormalised expert weights, leading dense layers), or experts in a family that has
    none. gpt-oss's experts (`gpt_oss`) have biases and a softmax over the chosen."""
    arch = meta.get("general.architecture")
    if has_experts and not meta.get(f"{arch}.expert_count"):
        raise UnsupportedModelError(f"GGUF metadata lacks {arch}.expert_count")

    def value(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    gating = value("expert_gating_func")
    grouped = (value("expert_group_count") or 0) > 1 or (value("expert_group_used_count") or 0)
    checks = (
        ((value("expert_shared_count") or 0) > 0, "shared experts (expert_shared_count)"),
        (grouped, "grouped expert routing (expert_group_count)"),
        (
            gating not in (None, CHOSEN_SOFTMAX_GATING if gpt_oss else SOFTMAX_GATING),
            f"{GATING.get(gating, 'an unknown')} router (expert_gating_func {gating})",
        ),
        (value("expert_weights_scale") not in (None, 1.0), "scaled expert weights"),
        (value("expert_weights_norm") is False, "expert weights left unnormalised"),
        ((value("leading_dense_block_count") or 0) > 0, "leading dense layers"),
    )
    for asked, what in checks:
        if asked:
            raise UnsupportedModelError(f"{arch}: not supported: {what}")
    for name in tensor_names:
        unbuilt = (u for u in UNBUILT_TENSORS if not (gpt_oss and u[0] in BIAS_TENSORS))
        found = next((w for part, w in unbuilt if part in name), None)
        if found is None and not has_experts and any(k in name for k in EXPERT_KINDS):
            found = f"experts in a {arch} layer"
        if found is not None:
            raise UnsupportedModelError(f"tensor {name}: not supported: {found}")


PACK_EXPERTS_ENV = "WARMFLEET_PACK_EXPERTS"


def pack_experts_asked() -> bool:
    """Whether WARMFLEET_PACK_EXPERTS=1 asks the CPU loader to repack the experts too (where
    the C kernels pack their type: a copy as large, made at every load), read at each load."""
    value = os.environ.get(PACK_EXPERTS_ENV, "0").strip()
    if value not in ("0", "1", ""):
        raise ValueError(f"{PACK_EXPERTS_ENV}={value!r}: expected 0 or 1")
    return value == "1"


def expert_matrix(tensor: Any, shape: tuple[int, ...]) -> ExpertMatrix:
    """The 3-D tensor's blocks as they lie in the file's map (a view, not a copy)."""
    qtype = gguf.GGMLQuantizationType(tensor.tensor_type)
    if qtype not in EXPERT_TYPES:
        kinds = ", ".join(t.name for t in EXPERT_TYPES)
        raise UnsupportedModelError(
            f"tensor {tensor.name}: experts of type {qtype.name} are not supported ({kinds})"
        )
    data = np.asarray(tensor.data)
    raw = data.view(np.uint8).reshape(shape[0], shape[1], -1)
    return ExpertMatrix(qtype, raw, shape[2])


def packed_from_file(m: ExpertMatrix, mapped: np.ndarray) -> ExpertMatrix:
    """m packed where the C kernels pack it (experts_native.packed), the pages of `mapped`
    (m's tensor in the file's map) then dropped from resident memory; else m itself."""
    p = packed(m)
    if p.packed:
        release_pages(mapped)
    return p
