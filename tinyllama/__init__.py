"""TinyLLaMA: a LLaMA-style decoder in four ever faster versions, with the tools to measure them."""

__version__ = "0.1.0"
