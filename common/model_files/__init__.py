"""Model files, read and converted in one room: a model argument -> an HF-format directory.

model_source.py     where model files come from: the alias, a GGUF file (converted once
                    into the cache, in a child process) or an HF directory; ModelSourceError
gguf_header.py      a GGUF file's header and tensor table in milliseconds (the engine's read)
gguf_names.py       GGUF tensor names -> HF module names, per architecture: one data table
gguf_config.py      GGUF metadata -> config.json and generation_config.json, per family
gguf_convert.py     GGUF -> HF directory: the tensors, the tokenizer, the files (`python -m`)
tokenizer_files.py  the tokenizer files a conversion finishes, shaped to load fast

Torch-free, every module: the conversion's tokenizer step imports transformers (and so
torch) inside gguf_convert's child process only. The model's facts every process agrees on
(context length, ModelFacts) are common.model_facts'.
"""
