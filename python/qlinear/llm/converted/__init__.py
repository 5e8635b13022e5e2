"""qlinear's own model file: ``convert`` writes it once from a Hugging Face checkpoint or a
GGUF file (round to nearest, or ``gptq``), ``source`` maps it for ``llm.load`` without
re-quantizing."""
