"""Facts about a model read from its HF directory, without torch: every process agrees.

The context length the engine enforces and the tokenizer workers validate against must be
the same number, so both compute it here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_hf_config(model_dir: str | Path) -> dict[str, Any]:
    """The config.json of an HF model directory: FileNotFoundError when there is none,
    ValueError when it cannot be read or is not a JSON object. The one reader of it."""
    path = Path(model_dir) / "config.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"model config not found: {path}") from None
    except OSError as e:
        raise ValueError(f"cannot read model config {path}: {e}") from e
    try:
        hf = json.loads(text)
    except ValueError as e:
        raise ValueError(f"model config {path} is not valid JSON: {e}") from e
    if not isinstance(hf, dict):
        raise ValueError(f"model config {path} is not a JSON object")
    return hf


def max_position_embeddings(hf: dict[str, Any]) -> int:
    if "n_positions" in hf and "max_position_embeddings" not in hf:  # GPT-2 naming
        return int(hf["n_positions"])
    return int(hf.get("max_position_embeddings", 2048))


def context_length(hf: dict[str, Any], override: int | None = None) -> int:
    """The model's own limit, lowered (never raised) by a configured max_model_len."""
    limit = max_position_embeddings(hf)
    return min(override, limit) if override else limit
