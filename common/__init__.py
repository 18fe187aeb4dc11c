"""Shared, torch-free code: configuration, wire messages, ZeroMQ helpers, logging, and
the model files (model_files/: GGUF header, names, conversion, model source, tokenizer
files); what a model family declares (families/), its tool-call formats (tool_formats/:
prompt, parser and grammar, used by the tokenizer worker and the frontend) and the
reasoning formats (reasoning_formats.py)."""
