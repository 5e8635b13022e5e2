"""Hugging Face checkpoints: ``config.json``, ``*.safetensors`` (read by our own checked reader,
``safetensors_file``) and ``tokenizer.json``; ``source`` quantizes the linear layers as they
are read."""
