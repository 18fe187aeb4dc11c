"""The tokenizer the detokenizer loads: tokenizer.json without what only encoding uses.

A BPE tokenizer's merges (Gemma 3: 514,906 of them, most of its 33 MB tokenizer.json)
only encode; decoding maps ids to tokens and runs the decoders. `tokenizers` spends
~0.65 of its ~1.0 s load on them, at start-up, on cores the scheduler is loading on. The
GGUF conversion (common.gguf_convert) therefore writes DECODE_TOKENIZER beside
tokenizer.json, the same JSON with the merges emptied; the detokenizer loads it when it is
there (a converted GGUF), else tokenizer.json (a Hugging Face directory, which we do not
write into, or a conversion cache from before this file).

    tokenizer.json ──write_decode_tokenizer──▶ decode_tokenizer.json (merges: [])
    model_dir ──load_decode_tokenizer──▶ tokenizers.Tokenizer (decode-only when it can)
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

DECODE_TOKENIZER = "decode_tokenizer.json"


def write_decode_tokenizer(model_dir: Path) -> bool:
    """Write model_dir/DECODE_TOKENIZER from model_dir/tokenizer.json; False (nothing
    written) unless it is a BPE tokenizer with merges to drop."""
    spec = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not model.get("merges"):
        return False
    model["merges"] = []
    (model_dir / DECODE_TOKENIZER).write_text(
        json.dumps(spec, ensure_ascii=False), encoding="utf-8"
    )
    return True


def load_decode_tokenizer(model_dir: Path) -> Tokenizer:
    """A tokenizer that decodes as model_dir's tokenizer.json does (it may not encode)."""
    slim = model_dir / DECODE_TOKENIZER
    return Tokenizer.from_file(str(slim if slim.is_file() else model_dir / "tokenizer.json"))
