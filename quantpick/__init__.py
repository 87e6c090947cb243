"""quantpick: the GGUF quant and llama.cpp placement that fits this machine and context."""

__version__ = "0.1.0"
