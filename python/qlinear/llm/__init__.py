"""qlinear.llm: an LLM runtime composed from qlinear's kernels, organized as mnn-llm:
tokenizer, embedding (in memory or on disk), decoder blocks, last-token lm head.

    from qlinear import llm
    model = llm.load("path/to/hf-checkpoint", bits=4, group_size=64)   # quantized at load
    for piece in model.stream([{"role": "user", "content": "Hello"}], max_new_tokens=64):
        print(piece, end="", flush=True)
    print(model.stats)

``llm.convert(src, out_dir)`` writes a quantized model that ``load`` opens without
re-quantizing (``method="gptq"`` with ``calibration=``: GPTQ, ``converted.gptq``); ``llm.perplexity``
scores a model on text; ``qlinear-llm`` is the command line (``cli``: one module per command).
Needs the ``llm`` extra (tokenizers, jinja2, tqdm).

Layout, by job:
- the file formats, one subpackage each: ``hf/`` (Hugging Face checkpoints), ``gguf/``, ``mnn/``
  (MNN exports), ``converted/`` (qlinear's own file, written by ``convert``); each reads its files
  into a ``source.Source``;
- ``loader`` picks the source for a path, ``assemble`` builds the Model from it;
- ``runtime/``: what runs a token (model, blocks and KV caches, experts, embedding, tokenizer,
  sampling), whatever the file was; ``archs/``: what each model family changes;
- ``flash/``: ``memory="flash"``, what stays resident and what is read per token;
- ``serve/``: the OpenAI-compatible HTTP server (the ``serve`` extra); ``cli/``: the commands;
  ``peers/``: MNN.llm and llama.cpp, run side by side on the same files.
"""

from .config import ModelConfig
from .converted.convert import convert
from .runtime.generation import Sampling
from .loader import load
from .runtime.model import Model, Stats
from .perplexity import perplexity
from .runtime.tokenizer import Tokenizer

__all__ = ["load", "convert", "perplexity", "Model", "ModelConfig", "Sampling", "Stats", "Tokenizer"]
