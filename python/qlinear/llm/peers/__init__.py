"""The engines qlinear is measured against, run on the same files: MNN's own LLM engine on an
MNN export (``mnn_llm``) and llama.cpp on a GGUF file (``llamacpp``)."""
