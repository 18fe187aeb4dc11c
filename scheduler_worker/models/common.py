"""What every model shares: normalized config, a checked weight loader."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.families import BY_ARCHITECTURE
from common.families.base import LayerRecipe, layer_windows
from scheduler_worker.backends.ops import Linear
from scheduler_worker.quant.linear import QuantLinear


def rope_theta_of(hf: dict[str, Any]) -> float:
    params = hf.get("rope_parameters") or {}
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def rope_scaling_of(hf: dict[str, Any]) -> dict[str, Any] | None:
    """transformers 5 keeps rope settings in `rope_parameters`; 4.x in `rope_scaling`."""
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters")
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return None if kind == "default" else scaling


def layer_windows_of(hf: dict[str, Any], architecture: str) -> tuple[int | None, ...]:
    """The sliding window of every layer (None: global attention), by the family's rules
    (common.families.base.layer_windows)."""
    return layer_windows(hf, BY_ARCHITECTURE[architecture].sliding)


@dataclass(frozen=True)
class ModelArgs:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    norm_eps: float
    hidden_act: str
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    hf_config: dict[str, Any]
    layer_windows: tuple[int | None, ...] = ()  # per layer: sliding window, None = global
    recipe: LayerRecipe = LayerRecipe()  # how the shared layers make a layer (its family's)

    @property
    def kv_window(self) -> int | None:
        """The window past which no layer reads a key, when every layer is windowed (KV
        blocks wholly before it can be given back); None when any layer is global."""
        if not self.layer_windows or any(w is None for w in self.layer_windows):
            return None
        return max(w for w in self.layer_windows if w is not None)

    @property
    def rotary_dim(self) -> int:
        """The leading dims of each head that RoPE rotates (all but for partial rotary)."""
        return int(self.head_dim * self.rotary_fraction)

    # a checkpoint's numbers for the shared layers, set by its family's args(); the defaults
    # change nothing
    embedding_scale: float = 1.0  # embeddings times it (rounded to the model's dtype)
    attention_scale: float | None = None  # the softmax scale; None: head_dim ** -0.5
    residual_multiplier: float = 1.0  # attention and MLP outputs scaled before the residual
    logit_divisor: float = 1.0  # logits divided by it
    logit_softcap: float | None = None  # logits -> tanh(logits / cap) * cap
    rotary_fraction: float = 1.0  # the part of each head RoPE rotates
    # RoPE (theta, scaling) of the global layers (None: the config's rope_theta and
    # rope_scaling) and of the windowed ones where they have their own (None: the global)
    global_rope: tuple[float, dict[str, Any] | None] | None = None
    local_rope: tuple[float, dict[str, Any] | None] | None = None
    # the one-call C++ decode step's style flags (common.families.base.Family.decode_style);
    # None: the family never takes it
    decode_style: tuple[str, ...] | None = ()

    @classmethod
    def from_hf(cls, hf: dict[str, Any], architecture: str) -> ModelArgs:
        family = BY_ARCHITECTURE[architecture]
        fields = family.args(hf)
        return cls(
            architecture=architecture,
            hf_config=hf,
            decode_style=family.decode_style,
            layer_windows=layer_windows(hf, family.sliding),
            recipe=fields.pop("recipe", family.recipe),
            **fields,
        )

    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem


class AttentionProjections(nn.Module):
    """What every attention layer sets up alike: its window (None: global attention), its
    head shapes and its stacked q/k/v and output projections."""

    def __init__(self, args: ModelArgs, layer_index: int = 0) -> None:
        super().__init__()
        windows = args.layer_windows
        self.window = windows[layer_index] if windows else None
        self.num_heads, self.num_kv_heads = args.num_heads, args.num_kv_heads
        self.head_dim = args.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = Linear(self.q_size, args.hidden_size, bias=args.o_bias)


class CausalLM(nn.Module):
    """What the model runner calls on every model (besides forward(input_ids, positions,
    kv_caches, meta) -> hidden states [T, hidden])."""

    def post_init(self) -> None:
        """Restore what building on the meta device lost (tied weights, rope tables)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def greedy_tokens(self, hidden: torch.Tensor, vocab: int) -> torch.Tensor | None:
        """int64 [rows]: compute_logits(hidden)[:, :vocab].max(dim=-1).indices, where the
        output head takes the argmax itself without writing the logits out (a model whose
        logits are its head's outputs, the head a QuantLinear that QuantLinear.argmax
        serves). None where it cannot: the caller computes the logits."""
        return None

    def enable_decode_layers(self) -> bool:
        """Run decode steps as one C++ call where the model and its op set can
        (models/decoder.py); returns whether they will."""
        return False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError


class ArgmaxHead(nn.Module):
    """An output head that takes the argmax of its logits itself (a tensor-parallel one:
    each rank's best of its vocabulary rows, compared on rank 0)."""

    def argmax(self, hidden: torch.Tensor, vocab: int) -> torch.Tensor:
        raise NotImplementedError


def head_argmax(head: nn.Module, hidden: torch.Tensor, vocab: int) -> torch.Tensor | None:
    """CausalLM.greedy_tokens of a model whose logits are `head`(hidden)."""
    return head.argmax(hidden, vocab) if isinstance(head, (QuantLinear, ArgmaxHead)) else None


class WeightLoader:
    """Copies checkpoint tensors into a module's parameters, checking names and shapes,
    and fails loudly on unknown names or parameters left unloaded."""

    def __init__(self, module: nn.Module) -> None:
        self.params = dict(module.named_parameters(remove_duplicate=True))
        self.loaded: dict[str, int] = {}  # name -> number of elements written

    def _param(self, name: str) -> nn.Parameter:
        if name not in self.params:
            raise ValueError(f"checkpoint has an unexpected weight {name!r}")
        return self.params[name]

    @torch.no_grad()
    def load(self, name: str, tensor: torch.Tensor) -> None:
        param = self._param(name)
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(
                f"weight {name!r}: shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
            )
        param.copy_(tensor)
        self.loaded[name] = param.numel()

    @torch.no_grad()
    def load_shard(self, name: str, tensor: torch.Tensor, offset: int, size: int) -> None:
        """Write rows [offset, offset+size) of a stacked parameter (dim 0)."""
        param = self._param(name)
        if tensor.shape[0] != size or tuple(tensor.shape[1:]) != tuple(param.shape[1:]):
            raise ValueError(f"weight shard for {name!r}: shape {tuple(tensor.shape)} does not fit")
        param[offset : offset + size].copy_(tensor)
        self.loaded[name] = self.loaded.get(name, 0) + tensor.numel()

    def finish(self) -> None:
        missing = [n for n, p in self.params.items() if self.loaded.get(n, 0) != p.numel()]
        if missing:
            raise ValueError(
                f"checkpoint is missing weights: {missing[:8]}{' ...' if len(missing) > 8 else ''}"
            )


# HF name piece -> (our stacked parameter piece, shard index)
STACKED_PIECES = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def load_stacked_weights(
    module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], args: ModelArgs
) -> None:
    """Load an HF decoder checkpoint into a module whose q/k/v and gate/up projections
    are stacked (qkv_proj, gate_up_proj); checkpoints that already hold them fused
    (Phi-3) load as they are. Names lose their `model.` prefix; a tied lm_head is skipped;
    a family's own checkpoint layout goes through its `weights` conversion first."""
    loader = WeightLoader(module)
    shard_sizes = {
        "qkv_proj": [
            args.num_heads * args.head_dim,
            args.num_kv_heads * args.head_dim,
            args.num_kv_heads * args.head_dim,
        ],
        "gate_up_proj": [args.intermediate_size, args.intermediate_size],
    }
    convert = BY_ARCHITECTURE[args.architecture].weights
    if convert is not None:
        weights = convert(weights, args.hf_config)
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        name = name.removeprefix("model.")
        if args.tie_word_embeddings and name.startswith("lm_head."):
            continue
        for piece, (fused, idx) in STACKED_PIECES.items():
            # a gate-less MLP's up_proj is a parameter of its own
            if f".{piece}." in name and name.replace(piece, fused) in loader.params:
                sizes = shard_sizes[fused]
                loader.load_shard(name.replace(piece, fused), tensor, sum(sizes[:idx]), sizes[idx])
                break
        else:
            loader.load(name, tensor)
    loader.finish()


def num_params(module: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in module.parameters())
