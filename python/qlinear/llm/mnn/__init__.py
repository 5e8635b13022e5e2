"""MNN LLM exports (the output directory of ``llmexport``): reading them, building them, and
the ``source`` that turns one into a qlinear model.

An export directory holds:

- ``config.json``: runtime settings of ``MNN.llm`` (threads, precision, memory, sampler, file names);
- ``llm_config.json``: the model's type, hidden size, layer count and chat template;
- ``llm.mnn``: the graph (``graph``);
- ``llm.mnn.weight``: the weight records (``weights``);
- ``embeddings_bf16.bin``: raw bf16 ``[vocab, hidden]``, the embedding table read from disk (absent
  with tied embeddings: the lm head's records are the embedding, see ``embedding``);
- ``tokenizer.mtok`` (or ``tokenizer.txt``): the tokenizer (``mtok``, ``tokenizer``).

``export.read_export`` reads a directory as a whole (``features``: what the graph computes
beyond its weights, and how that makes a Gemma export differ from its checkpoint); ``llmexport_runner.export_with_llmexport``
builds one; ``source`` turns an export into a qlinear model (``qlinear.llm.peers.mnn_llm``
runs MNN's own engine, ``MNN.llm``, on one).
"""

from .export import SUPPORTED_MODEL_TYPES, MnnExport, read_export
from .graph import read_graph
from .llmexport_runner import export_with_llmexport, llmexport_script
from .tokenizer import read_tokenizer
from .weights import QuantizedLinear

__all__ = ["QuantizedLinear", "MnnExport", "read_export", "read_graph", "read_tokenizer",
           "export_with_llmexport", "llmexport_script", "SUPPORTED_MODEL_TYPES"]
