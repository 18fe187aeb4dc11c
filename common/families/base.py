"""What a model family is, torch-free: one `Family` per file of this package, read by the
GGUF conversion (common.model_files), the engine's loader and its models.

    Family
      hf_architectures   the HF `architectures` names it serves
      recipe             LayerRecipe: how the shared decoder layers (scheduler_worker/
                         models/layers.py) make its layer
      args(hf)           ModelArgs' fields from an HF config.json (decoder_args: the llama
                         layout's, a family overrides what differs; a "recipe" entry
                         replaces the family's where the config changes it)
      weights            checkpoint (name, tensor) -> HF llama-layout ones, for a family
                         whose checkpoints name or lay out their tensors otherwise
      sliding            where its config's sliding window applies (layer_windows)
      tool_format        the tool-call format of its chat templates and fine-tunes
                         (common/tool_formats/), unless its template holds a marker of
                         tool_format_markers: (template text, format)
      decode_style       the one-call C++ decode step's style flags (models/decode_plan.py:
                         "qk_norm", "sandwich", "gelu_tanh"); None: the family never takes it
      gguf               GGUFSpec, where llama.cpp has an architecture for it:
        arch, model_type   general.architecture, and the config.json model_type it becomes
        layer_names        GGUF layer tensor -> HF module (LLAMA_LAYERS, edited)
        qk_permuted        llama.cpp's converter permuted the Q and K rows
        norm_plus_one      norm weights stored as 1 + w (Gemma)
        config(read, cfg)  config.json keys from the file's metadata beyond the llama ones
        chat_template      the template of files published without one
        stop_tokens        tokens that end a turn beside EOS (generation_config.json)

A new family: a file here with its Family, and its line in `__init__.py` (FAMILIES).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# GGUF layer tensor -> HF module: the llama layout every llama-like architecture starts from
LLAMA_LAYERS: Mapping[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
QK_NORM_LAYERS: Mapping[str, str] = {
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
# our stacked linears -> the HF modules stacked into each (a family whose file holds one
# fused already, as Phi-3's, maps its GGUF tensor onto ours directly)
STACKED: Mapping[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}

Read = Callable[[str, Any], Any]  # a GGUF metadata key's value, or the default given
# a checkpoint's (name, tensor) pairs and its config.json -> the llama layout's pairs
Weights = Callable[[Iterable[tuple[str, Any]], dict], Iterator[tuple[str, Any]]]


@dataclass(frozen=True)
class LayerRecipe:
    """How the shared decoder layers (scheduler_worker/models/layers.py) make a family's
    layer. The defaults are the llama layout:  h += attn(norm(h)); h += mlp(norm(h))."""

    norm: str = "rms"  # "rms" (RMSNorm) or "layer_norm" (LayerNorm with bias)
    norm_weight_offset: float = 0.0  # 1.0: an RMSNorm's gain is 1 + w, in float32
    pre_norm: bool = True  # the attention's and the MLP's inputs normed
    post_norm: bool = False  # their outputs normed before the residual add (both: sandwich)
    qk_norm: str | None = None  # q and k RMS-normed before RoPE: "head" (each head) or "full"
    parallel_residual: bool = False  # h += attn(norm(h)) + mlp(norm'(h)), from one h
    gated_mlp: bool = True  # act(gate) * up; False: act(up)
    learned_positions: bool = False  # a position embedding added to the tokens', no RoPE

    def __post_init__(self) -> None:
        if self.norm not in ("rms", "layer_norm") or self.qk_norm not in (None, "head", "full"):
            raise ValueError(f"unknown norm {self.norm!r} or qk_norm {self.qk_norm!r}")
        if not (self.pre_norm or self.post_norm) or (self.parallel_residual and self.post_norm):
            raise ValueError("a layer needs pre or post norms; parallel ones take pre norms")


@dataclass(frozen=True)
class GGUFSpec:
    arch: str
    model_type: str
    layer_names: Mapping[str, str] = field(default_factory=lambda: dict(LLAMA_LAYERS))
    qk_permuted: bool = False
    norm_plus_one: bool = False
    config: Callable[[Read, dict], dict] | None = None
    chat_template: str | None = None
    stop_tokens: tuple[str, ...] = ()

    def linears(self) -> dict[str, tuple[str, ...]]:
        """Our stacked linears of a layer -> the GGUF tensors (blk.N.<name>) stacked into
        each, in order."""
        by_hf = {hf: g for g, hf in self.layer_names.items()}
        out = {}
        for ours, parts in STACKED.items():
            out[ours] = (by_hf[ours],) if ours in by_hf else tuple(by_hf[p] for p in parts)
        return out


@dataclass(frozen=True)
class Family:
    name: str
    hf_architectures: tuple[str, ...]
    args: Callable[[dict], dict]
    recipe: LayerRecipe = LayerRecipe()
    weights: Weights | None = None
    decode_style: tuple[str, ...] | None = ()
    sliding: str = "layer_types"  # how its config places sliding windows (layer_windows)
    tool_format: str = "hermes"
    tool_format_markers: tuple[tuple[str, str], ...] = ()
    gguf: GGUFSpec | None = None


def layer_windows(hf: dict, sliding: str = "layer_types") -> tuple[int | None, ...]:
    """The sliding window of every layer (None: global attention), as transformers reads
    the config: `layer_types` where the config lists them (Gemma 3, Qwen2/3 in
    transformers 5), else by the family's `sliding`: "every_layer" (Mistral, Phi-3)
    `sliding_window` on every layer, "qwen" on the layers from `max_window_layers` on
    where `use_sliding_window` is set, "layer_types" none."""
    num_layers = int(hf.get("num_hidden_layers", hf.get("n_layer", 0)))
    window = hf.get("sliding_window")
    if window is not None:
        window = int(window)
        if window < 1:
            raise ValueError(f"sliding_window must be >= 1, got {window}")
    types = hf.get("layer_types")
    if types is not None:
        if len(types) != num_layers:
            raise ValueError(f"layer_types lists {len(types)} layers, the model has {num_layers}")
        return tuple(window if t == "sliding_attention" else None for t in types)
    if window is None:
        return (None,) * num_layers
    if sliding == "every_layer":
        return (window,) * num_layers
    if sliding == "qwen" and hf.get("use_sliding_window"):
        first = int(hf.get("max_window_layers", num_layers))
        return tuple(window if i >= first else None for i in range(num_layers))
    return (None,) * num_layers


def decoder_args(
    hf: dict,
    norm_eps: tuple[str, float] = ("rms_norm_eps", 1e-6),
    attention_bias: bool = False,
    partial_rotary: bool = False,
) -> dict:
    """ModelArgs' fields of a llama-layout config.json (but the architecture, the config
    itself, the layer windows and the decode style: ModelArgs.from_hf's, from the Family).
    A family whose config differs gives its `norm_eps` key and default, its
    `attention_bias` default, and `partial_rotary` where it sets rotary_fraction itself."""
    num_heads = hf["num_attention_heads"]
    hidden = hf["hidden_size"]
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    partial = float(rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)))
    if partial != 1.0 and not partial_rotary:
        raise ValueError(
            f"partial rotary embeddings (partial_rotary_factor {partial}) are not supported"
        )
    bias = bool(hf.get("attention_bias", attention_bias))
    return dict(
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=hf.get("head_dim") or hidden // num_heads,
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        norm_eps=hf.get(*norm_eps),
        hidden_act=hf.get("hidden_act") or hf.get("hidden_activation") or "silu",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bool(hf.get("mlp_bias", False)),
    )
