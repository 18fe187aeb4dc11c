"""Shared, torch-free code: configuration, wire messages, ZeroMQ helpers, logging, and
the model files (model_files/: GGUF header, names, conversion, model source, tokenizer
files)."""
