"""qlinear.llm: a small LLM runtime (Qwen2 and Llama families) composed from qlinear's kernels,
organized as mnn-llm: tokenizer, embedding (in memory or on disk), decoder blocks, lm head.

    from qlinear import llm
    model = llm.load("path/to/hf-checkpoint", bits=4, group_size=64)   # quantized at load
    for piece in model.stream([{"role": "user", "content": "Hello"}], max_new_tokens=64):
        print(piece, end="", flush=True)
    print(model.stats)

``llm.convert(src, out_dir)`` writes a quantized model that ``load`` opens without
re-quantizing (``method="gptq"`` with ``calibration=``: GPTQ, ``llm.gptq``); ``llm.perplexity``
scores a model on text; ``qlinear-llm`` is the command line (generate, chat, bench, convert,
perplexity, serve, make-test-model). Needs the ``llm`` extra (tokenizers, jinja2, tqdm).

Layout: one module per model source (``hf_source``, ``converted_source``, ``mnn_source``), each
returning a ``source.Source``; ``assemble`` builds the Model from it; ``loader`` picks the source;
``mnn/`` reads MNN's files and runs llmexport and MNN.llm; ``serve/`` is the OpenAI-compatible HTTP
server (the ``serve`` extra).
"""

from .config import ModelConfig
from .convert import convert
from .generation import Sampling
from .loader import load
from .model import Model, Stats
from .perplexity import perplexity
from .tokenizer import Tokenizer

__all__ = ["load", "convert", "perplexity", "Model", "ModelConfig", "Sampling", "Stats", "Tokenizer"]
