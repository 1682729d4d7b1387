"""Every family the engine runs, and the one a file's architecture names."""

from __future__ import annotations

from common.errors import UnsupportedModelError
from engine.models import gpt_oss, llama, qwen2, qwen3, qwen3moe
from engine.models.family import Family

FAMILIES = (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, qwen3moe.FAMILY, gpt_oss.FAMILY)


def family_for(architecture: object) -> Family:
    """The family that runs `architecture` (a file's general.architecture);
    UnsupportedModelError naming the supported ones where none does."""
    for family in FAMILIES:
        if architecture in family.architectures:
            return family
    supported = ", ".join(a for f in FAMILIES for a in f.architectures)
    raise UnsupportedModelError(
        f"architecture {architecture!r} is not supported (supported: {supported})"
    )
