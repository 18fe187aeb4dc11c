"""The speculative-decoding choices a config may name (scheduler_worker/spec/), and the
default method resolved by the device."""

from __future__ import annotations

from typing import Any

from common.config_error import ConfigError

# auto: by the device (resolved_method): ngram on a CPU, where the policy's
# measurements show it does not lose (docs/benchmarks.md, "Idle runs, seventh session");
# none on CUDA, whose verify step has not been measured yet
SPECULATIVE_METHODS = ("auto", "none", "ngram", "suffix", "draft")
SPECULATIVE_POLICIES = ("adaptive", "always")
MAX_SPECULATIVE_TOKENS = 16


def resolved_method(method: str, device_type: str) -> str:
    """auto: ngram on a CPU, none elsewhere (CUDA: no verify step measured yet); any
    other method as given."""
    if method != "auto":
        return method
    return "ngram" if device_type == "cpu" else "none"


def check(cfg: Any) -> None:
    """A SchedulerConfig's speculative fields valid (ConfigError), and a draft model given
    alone meaning method draft."""
    for name, allowed in (
        ("speculative_method", SPECULATIVE_METHODS),
        ("speculative_policy", SPECULATIVE_POLICIES),
    ):
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"{name} must be one of {allowed}, got {getattr(cfg, name)!r}")
    if cfg.speculative_model and cfg.speculative_method in ("auto", "none"):
        object.__setattr__(cfg, "speculative_method", "draft")
    if cfg.speculative_method == "draft" and not cfg.speculative_model:
        raise ConfigError("speculative_method draft needs a speculative_model (a path)")
    k = cfg.num_speculative_tokens
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
        raise ConfigError(
            f"num_speculative_tokens must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}"
        )
