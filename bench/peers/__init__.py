"""Third-party quantized linear layers used as benchmark peers for qlinear."""
