"""The tokenizer files a GGUF conversion writes, shaped to load fast at every start.

Three processes parse the model's tokenizer.json at start-up, on the cores the scheduler
loads on: the tokenizer worker (`tokenizers`), the detokenizer (`tokenizers`) and the
scheduler (llguidance, on the engine's critical path). For Gemma 3 it is 33 MB, most of it
514,906 BPE merges. So the conversion (common.model_files.gguf_convert) finishes the files
that transformers' save_pretrained wrote:

    tokenizer.json ──finish_tokenizer_files──▶ tokenizer.json: compact JSON, merges as
                                               "a b" strings (when no part holds a space)
                                           └─▶ decode_tokenizer.json (merges: [])

- transformers writes tokenizer.json indented, a merge over four lines: Gemma 3's is
  33 MB. Compact, with merges as "a b" strings (the form most published tokenizer.json
  files use; `tokenizers` reads both), it is 13 MB and loads in 0.67-0.73 s instead of
  0.89-1.1 s; llguidance builds its tokenizer in 1.7-1.8 s instead of 2.0-2.1 s (the
  string merges alone, both compact). Pairs stay where a part holds a space (the string
  form would be ambiguous there).
- The merges only encode: decoding maps ids to tokens and runs the decoders. The
  detokenizer loads decode_tokenizer.json (6 MB, 0.33-0.36 s) when it is there (a
  converted GGUF), else tokenizer.json (a Hugging Face directory, which we never write
  into, or a conversion cache from before this file).
- Launch to /health on the Gemma 3 file (avx512 Zen 4, 2 cores), six alternating pairs:
  6.8-7.8 s (mean 7.08) with transformers' files -> 4.5-5.5 s (mean 4.99) with these.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

DECODE_TOKENIZER = "decode_tokenizer.json"


def finish_tokenizer_files(model_dir: Path) -> None:
    """Rewrite model_dir/tokenizer.json compact, its BPE merges as strings where that is
    exact, and write model_dir/DECODE_TOKENIZER; a tokenizer that is not BPE is left as it
    is."""
    path = model_dir / "tokenizer.json"
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges:
        return
    if all(isinstance(m, list) and " " not in m[0] and " " not in m[1] for m in merges):
        model["merges"] = [f"{a} {b}" for a, b in merges]
        _write(path, spec)
    model["merges"] = []
    _write(model_dir / DECODE_TOKENIZER, spec)


def _write(path: Path, spec: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def load_decode_tokenizer(model_dir: Path) -> Tokenizer:
    """A tokenizer that decodes as model_dir's tokenizer.json does (it may not encode)."""
    slim = model_dir / DECODE_TOKENIZER
    return Tokenizer.from_file(str(slim if slim.is_file() else model_dir / "tokenizer.json"))


def same_tokenizer(target_dir: Path, draft_dir: Path) -> str | None:
    """None when both directories' tokenizer.json map the same tokens to the same ids,
    else why not (a draft's ids mean nothing to a target with another vocabulary)."""

    def vocab(d: Path) -> tuple[dict, list] | None:
        try:
            tok = json.loads((d / "tokenizer.json").read_text())
        except (OSError, ValueError):
            return None
        added = sorted((t.get("id"), t.get("content")) for t in tok.get("added_tokens") or [])
        return (tok.get("model") or {}).get("vocab") or {}, added

    a, b = vocab(target_dir), vocab(draft_dir)
    if a is None or b is None:
        return "no tokenizer.json to compare in " + str(draft_dir if b is None else target_dir)
    if a[0] != b[0]:
        return "the tokenizers' vocabularies differ"
    if a[1] != b[1]:
        return "the tokenizers' added tokens differ"
    return None
