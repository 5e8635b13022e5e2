"""GGUF files (llama.cpp's format): the checked reader (``file``), its metadata as a model
configuration (``config``), its tokenizer rebuilt (``tokenizer``) and the ``source`` that maps
the tensors, quantized codes moved into our layout without re-rounding."""
