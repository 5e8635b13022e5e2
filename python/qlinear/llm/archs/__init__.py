"""Architectures: what each model family changes on the shared decoder block.

The runtime (``layers``, ``assemble``, the compiled decode step) knows features, not families:
a ``ModelConfig`` says whether query / key heads are normalized, which activation the MLP uses,
which layers attend over a sliding window, and so on. An ``Arch`` turns one family's
``config.json`` into those features (``config``) and says where its checkpoint keeps each of our
tensors (``layer_tensors``). One module per family; ``ARCHS`` maps ``model_type`` to its Arch.
"""

from __future__ import annotations

from . import gemma, gemma4, gpt_oss, lfm2, llama, mistral, mixtral, olmoe, phi3, qwen2_moe, qwen3, qwen3_5, qwen3_moe
from .base import Arch

ARCHS: dict[str, Arch] = {a.model_type: a for a in (
    llama.QWEN2, llama.LLAMA, qwen3.QWEN3, qwen3_moe.QWEN3_MOE, mistral.MISTRAL, gemma.GEMMA2, gemma.GEMMA3,
    phi3.PHI3, olmoe.OLMOE, mixtral.MIXTRAL, qwen2_moe.QWEN2_MOE, qwen3_5.QWEN3_5, qwen3_5.QWEN3_5_MOE, lfm2.LFM2,
    gpt_oss.GPT_OSS, gemma4.GEMMA4)}

# model types that hold a text model we could read but in a checkpoint we do not: what to say
NOT_TEXT_ONLY = {
    "gemma3": "Gemma3ForConditionalGeneration (vision + text): its vision_config / vision tower are "
              "not supported; a text-only Gemma 3 checkpoint has model_type 'gemma3_text'",
}


# multimodal model types whose text model we read (its fields under text_config) -> its model type
TEXT_PARTS = {**qwen3_5.MULTIMODAL, **gemma4.MULTIMODAL}


def text_part(hf: dict, where: str = "config.json") -> dict:
    """``hf`` itself, or for a multimodal checkpoint whose text model we read (``TEXT_PARTS``) the
    fields of that text model (``text_config``; the outer config's token ids and tied
    embeddings, where it gives them, win)."""
    outer = hf.get("model_type")
    if outer not in TEXT_PARTS:
        return hf
    text = hf.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"{where}: model_type {outer!r} needs a text_config object")
    out = {**text, "model_type": TEXT_PARTS[outer]}
    for key in ("tie_word_embeddings", "bos_token_id", "eos_token_id"):
        if hf.get(key) is not None:
            out[key] = hf[key]
    return out


def get(model_type, where: str = "config.json") -> Arch:
    """The Arch of ``model_type``; ValueError naming it (and what is missing) otherwise."""
    if model_type in NOT_TEXT_ONLY:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported: {NOT_TEXT_ONLY[model_type]}")
    if model_type not in ARCHS:
        raise ValueError(f"{where}: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(ARCHS)})")
    return ARCHS[model_type]


__all__ = ["ARCHS", "Arch", "TEXT_PARTS", "get", "text_part"]
