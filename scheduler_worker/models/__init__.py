"""Model registry: HF `architectures` name -> the shared decoder, which every family
runs (the families themselves: common/families, one file each)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from common.families import BY_ARCHITECTURE
from common.model_facts import read_hf_config
from scheduler_worker.models.common import CausalLM, ModelArgs
from scheduler_worker.models.decoder import DecoderForCausalLM

MODEL_REGISTRY: dict[str, type[CausalLM]] = {arch: DecoderForCausalLM for arch in BY_ARCHITECTURE}


class UnsupportedModelError(ValueError):
    pass


def architecture_of(hf: dict) -> str:
    archs = hf.get("architectures") or []
    for arch in archs:
        if arch in MODEL_REGISTRY:
            return arch
    raise UnsupportedModelError(
        f"unsupported model architecture {archs or hf.get('model_type')!r}; "
        f"supported: {sorted(MODEL_REGISTRY)}"
    )


def check_servable(args: ModelArgs) -> None:
    """Refuse, in one line at load, the shapes the attention cannot run (rather than a
    worker that loads, reports healthy and fails at its first step)."""
    problems = []
    if args.num_kv_heads < 1 or args.num_heads % args.num_kv_heads:
        problems.append(
            f"{args.num_heads} query heads are not a multiple of {args.num_kv_heads} KV heads"
        )
    if args.rotary_dim % 2 or (args.rotary_dim < 2 and not args.recipe.learned_positions):
        problems.append(
            f"rotary dims {args.rotary_dim} of head_dim {args.head_dim} are not even "
            "(rotary embeddings need pairs)"
        )
    if any(w is not None and w < 1 for w in args.layer_windows):
        problems.append(f"sliding windows {args.layer_windows} must be >= 1")
    if problems:
        raise UnsupportedModelError(
            f"model {args.architecture} cannot be served: {'; '.join(problems)}"
        )


def iter_safetensors(
    model_dir: Path, read: Callable[[Any, str], torch.Tensor] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the directory's safetensors files, by name; `read(file, name)`
    reads one another way (a tensor-parallel rank: its slice only)."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {model_dir}")
    for file in files:
        try:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, read(f, name) if read else f.get_tensor(name)
        except (OSError, ValueError, RuntimeError) as e:
            raise ValueError(f"cannot read weights file {file}: {e}") from e


def servable_args(hf: dict, arch: str) -> ModelArgs:
    """The model's shapes from its HF config, or UnsupportedModelError in one line when the
    engine cannot serve them (checked before any weight is read)."""
    try:
        args = ModelArgs.from_hf(hf, arch)
    except (KeyError, TypeError, ValueError) as e:
        detail = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise UnsupportedModelError(f"model config of {arch} cannot be served: {detail}") from e
    check_servable(args)
    return args


def load_model(
    model_dir: Path, dtype: torch.dtype, device: torch.device
) -> tuple[CausalLM, ModelArgs]:
    hf = read_hf_config(model_dir)
    arch = architecture_of(hf)
    args = servable_args(hf, arch)
    with torch.device("meta"):
        model = MODEL_REGISTRY[arch](args)
    model = model.to_empty(device="cpu")
    model.post_init()  # re-tie weights and rebuild rope tables lost on the meta device
    model.load_weights(iter_safetensors(model_dir))
    return model.to(device=device, dtype=dtype).eval(), args
