"""Architectures: what each model family changes on the shared decoder block.

The runtime (``layers``, ``assemble``, the compiled decode step) knows features, not families:
a ``ModelConfig`` says whether query / key heads are normalized, which activation the MLP uses,
which layers attend over a sliding window, and so on. An ``Arch`` turns one family's
``config.json`` into those features (``config``) and says where its checkpoint keeps each of our
tensors (``layer_tensors``). One module per family; ``ARCHS`` maps ``model_type`` to its Arch.
"""

from __future__ import annotations

from . import gemma, llama, mistral, mixtral, olmoe, phi3, qwen2_moe, qwen3, qwen3_moe
from .base import Arch

ARCHS: dict[str, Arch] = {a.model_type: a for a in (
    llama.QWEN2, llama.LLAMA, qwen3.QWEN3, qwen3_moe.QWEN3_MOE, mistral.MISTRAL, gemma.GEMMA2, gemma.GEMMA3,
    phi3.PHI3, olmoe.OLMOE, mixtral.MIXTRAL, qwen2_moe.QWEN2_MOE)}

# model types that hold a text model we could read but in a checkpoint we do not: what to say
NOT_TEXT_ONLY = {
    "gemma3": "Gemma3ForConditionalGeneration (vision + text): its vision_config / vision tower are "
              "not supported; a text-only Gemma 3 checkpoint has model_type 'gemma3_text'",
}


def get(model_type, where: str = "config.json") -> Arch:
    """The Arch of ``model_type``; ValueError naming it (and what is missing) otherwise."""
    if model_type in NOT_TEXT_ONLY:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported: {NOT_TEXT_ONLY[model_type]}")
    if model_type not in ARCHS:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(ARCHS)})")
    return ARCHS[model_type]


__all__ = ["ARCHS", "Arch", "get"]
