"""Facts about a model read from its HF directory, without torch: every process agrees.

The context length the engine enforces and the tokenizer workers validate against must be
the same number, so both compute it here; each announces its numbers (ModelFacts) and the
frontend refuses a component whose numbers differ from the replicas'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """What a component announces about the model it serves when it joins (and in every
    status after): a scheduler replica the model it loaded (the owner of every number
    here), a tokenizer worker what it computed from the same model directory and checks
    requests against. The frontend compares each newcomer with the replicas already in
    (frontend.cluster) and uses the replicas' numbers (routing key, intake checks)."""

    model: str  # the served model name (Config.model_name)
    vocab_size: int  # the logits' width
    max_model_len: int  # the context length: prompt and output together
    block_size: int  # tokens per KV block; 0: the announcer keeps no KV cache (a tokenizer)

    def differences(self, other: ModelFacts) -> str | None:
        """How `other` disagrees with these facts, or None; a block_size of 0 (a
        component without a KV cache) agrees with any."""
        diff = [
            f"{name} {theirs!r} (not {mine!r})"
            for name, mine, theirs in (
                ("model", self.model, other.model),
                ("vocab_size", self.vocab_size, other.vocab_size),
                ("max_model_len", self.max_model_len, other.max_model_len),
                ("block_size", self.block_size, other.block_size),
            )
            if mine != theirs and not (name == "block_size" and 0 in (mine, theirs))
        ]
        return ", ".join(diff) if diff else None

    def to_wire(self) -> tuple[str, int, int, int]:
        return (self.model, self.vocab_size, self.max_model_len, self.block_size)

    @classmethod
    def from_wire(cls, t: tuple[str, int, int, int]) -> ModelFacts:
        return cls(*t)


def eos_token_ids(hf: dict, model_dir: Path) -> list[int]:
    """The model's EOS ids: config.json's, then generation_config.json's."""
    ids: list[int] = []
    for source in (hf, _read_json(model_dir / "generation_config.json")):
        eos = source.get("eos_token_id")
        for t in eos if isinstance(eos, list) else [eos]:
            if isinstance(t, int) and t not in ids:
                ids.append(t)
    return ids


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
