"""The error every config check raises, and the checks common.config and common.gpus
share (a leaf module: both import it, neither the other for it)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting that cannot work: the message says which and why."""


def parse_gpu_ids(text: str) -> tuple[int, ...]:
    """`--gpu-ids 2,3`: distinct indexes into the visible GPUs, in the order given."""
    entries = [e.strip() for e in text.split(",")]
    if not entries or not all(e.isdigit() for e in entries):
        raise ConfigError(f"gpu_ids must be GPU indexes separated by commas (2,3), got {text!r}")
    ids = tuple(int(e) for e in entries)
    if len(set(ids)) != len(ids):
        raise ConfigError(f"gpu_ids names a GPU twice: {text!r}")
    return ids
