"""qlinear.llm: a small LLM runtime (Qwen2 and Llama families) composed from qlinear's kernels,
organized as mnn-llm: tokenizer, embedding (in memory or on disk), decoder blocks, lm head.

    from qlinear import llm
    model = llm.load("path/to/hf-checkpoint", bits=4, group_size=64)   # quantized at load
    for piece in model.stream([{"role": "user", "content": "Hello"}], max_new_tokens=64):
        print(piece, end="", flush=True)
    print(model.stats)

``llm.convert(hf_dir, out_dir)`` writes a quantized model that ``load`` opens without
re-quantizing; ``qlinear-llm`` is the command line (generate, chat, bench, convert).
Needs the ``llm`` extra (tokenizers, jinja2, tqdm).
"""

from .config import ModelConfig
from .generation import Sampling
from .convert import convert
from .loader import load
from .model import Model, Stats
from .tokenizer import Tokenizer

__all__ = ["load", "convert", "Model", "ModelConfig", "Sampling", "Stats", "Tokenizer"]
