"""Gemma 3 text (Gemma3ForCausalLM, model_type gemma3_text) in plain torch.

Where it differs from Llama:

    embeddings * sqrt(hidden)
    layer:  h += post_attention_norm(attn(input_norm(h)))
            h += post_feedforward_norm(mlp(pre_feedforward_norm(h)))
    attn:   q, k RMS-normed per head (QK-norm) before RoPE; scale query_pre_attn_scalar^-0.5;
            local layers: sliding window, RoPE base rope_local_base_freq (10k);
            global layers: full context, RoPE base rope_theta (1M) with its scaling
    norms:  Gemma RMSNorm, x * (1 + w), computed in float32
    mlp:    gelu_tanh(gate) * up (LlamaMLP with Gemma's activation)
    logits: tanh(logits / cap) * cap when final_logit_softcapping is set

The layer kinds come from the config's `layer_types` (ModelArgs.layer_windows). Weight
names are HF's; q/k/v and gate/up are stacked on load as for Llama. When every decoder
linear takes the integer kernels, a decode step runs its layers as one C++ call
(models/decode_plan.py, with the sandwich norms, QK-norm, GELU-tanh, both RoPE bases and
each layer's window), the norms' (1 + w) weights computed once at load.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch
from torch import nn

from scheduler_worker.activations import GELU_TANH_ACTS
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.ops import TORCH_OPS, TorchOps
from scheduler_worker.models.common import (
    AttentionProjections,
    CausalLM,
    ModelArgs,
    head_argmax,
    load_stacked_weights,
)
from scheduler_worker.models.decode_plan import DecodePlan, plan_decode_layers, style_of
from scheduler_worker.models.llama import LlamaMLP
from scheduler_worker.rope import RotaryEmbedding, rotate


class GemmaRMSNorm(nn.Module):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)
    weight_offset = 1.0  # the gain is 1 + weight

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """Gemma's norm of x, in out_dtype (a float32 residual stream's norm in the
        model's dtype), else x's."""
        return self.ops.rms_norm(x, None, self.weight, self.eps, self.weight_offset, out_dtype)


def _rope_settings(hf: dict[str, Any]) -> dict[str, tuple[float, dict[str, Any] | None]]:
    """(theta, scaling) of the local and global layers, from transformers 5's nested
    `rope_parameters` or the older `rope_theta` / `rope_local_base_freq` / `rope_scaling`."""
    params = hf.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or hf.get("rope_scaling") or {})
    local = dict(params.get("sliding_attention") or {})
    full_theta = float(full.pop("rope_theta", hf.get("rope_theta", 1_000_000.0)))
    local_theta = float(local.pop("rope_theta", hf.get("rope_local_base_freq", 10_000.0)))

    def scaling(p: dict[str, Any]) -> dict[str, Any] | None:
        kind = p.get("rope_type", p.get("type", "default"))
        return None if kind == "default" else p

    return {"local": (local_theta, scaling(local)), "global": (full_theta, scaling(full))}


class Gemma3Attention(AttentionProjections):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs, layer_index: int) -> None:
        super().__init__(args, layer_index)
        hf = args.hf_config
        if hf.get("attn_logit_softcapping") is not None:
            raise ValueError("attention logit softcapping (Gemma 2) is not supported")
        self.q_norm = GemmaRMSNorm(self.head_dim, args.norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, args.norm_eps)
        self.scale = float(hf.get("query_pre_attn_scalar") or self.head_dim) ** -0.5

    def forward(self, cos_sin, x, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        t = qkv.shape[0]
        q = self.q_norm(qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim))
        k = self.k_norm(
            qkv[:, self.q_size : self.q_size + self.kv_size].view(
                t, self.num_kv_heads, self.head_dim
            )
        )
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        q, k = rotate(q, *cos_sin), rotate(k, *cos_sin)
        self.ops.write_kv(k, v, kv_cache, meta)
        o = self.ops.attention(q, k, v, kv_cache, meta, self.scale, self.window)
        return self.o_proj(o.reshape(-1, self.q_size))


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_index: int) -> None:
        super().__init__()
        dim, eps = args.hidden_size, args.norm_eps
        self.is_local = args.layer_windows[layer_index] is not None
        self.input_layernorm = GemmaRMSNorm(dim, eps)
        self.self_attn = Gemma3Attention(args, layer_index)
        self.post_attention_layernorm = GemmaRMSNorm(dim, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(dim, eps)
        self.mlp = LlamaMLP(args)
        self.post_feedforward_layernorm = GemmaRMSNorm(dim, eps)

    def forward(self, cos_sin, h, kv_cache, meta, dtype: torch.dtype) -> torch.Tensor:
        """h: the residual stream (its dtype the op set's residual_dtype, else the model's
        `dtype`); the sandwich norms' outputs are `dtype` and added into h."""
        a = self.self_attn(cos_sin, self.input_layernorm(h, dtype), kv_cache, meta)
        h = h + self.post_attention_layernorm(a)
        m = self.mlp(self.pre_feedforward_layernorm(h, dtype))
        return h + self.post_feedforward_layernorm(m)


class Gemma3ForCausalLM(CausalLM):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.decode_plan: DecodePlan | None = None  # set by enable_decode_layers()
        softcap = args.hf_config.get("final_logit_softcapping")
        self.softcap = float(softcap) if softcap else None
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = GemmaRMSNorm(args.hidden_size, args.norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.ropes = self._make_ropes()
        self.post_init()

    def _make_ropes(self) -> nn.ModuleDict:
        a = self.args
        return nn.ModuleDict(
            {
                # no tables: 32k positions x two bases would be 67 MB beside the weights
                kind: RotaryEmbedding(
                    a.head_dim, a.max_position_embeddings, theta, scaling, table=False
                )
                for kind, (theta, scaling) in _rope_settings(a.hf_config).items()
            }
        )

    def post_init(self) -> None:
        # a GGUF model's lm_head / embedding are modules over the file's tensors (the loader)
        tied = isinstance(self.lm_head, nn.Linear) and isinstance(self.embed_tokens, nn.Embedding)
        if self.args.tie_word_embeddings and tied:
            self.lm_head.weight = self.embed_tokens.weight
        if self.norm.weight.device.type != "meta":
            self.ropes = self._make_ropes()

    def enable_decode_layers(self) -> bool:
        """Decode steps whose linears all take the integer kernels as one C++ call
        (decode_plan.py); returns whether the plan was made."""
        style = self.args.decode_style
        if style is None or self.ops.kernel_isa is None:
            return False
        if self.args.hidden_act not in GELU_TANH_ACTS:
            return False

        def w(norm: nn.Module) -> torch.Tensor:  # Gemma's x * (1 + w), as a plain weight
            weight = cast(GemmaRMSNorm, norm).weight.detach()
            return (1.0 + weight.float()).to(weight.dtype)

        items: list[torch.Tensor | nn.Module] = []
        for layer in cast(list[Gemma3DecoderLayer], list(self.layers)):
            attn, mlp = layer.self_attn, layer.mlp
            items += [w(layer.input_layernorm), w(attn.q_norm), w(attn.k_norm)]
            items += [attn.qkv_proj, attn.o_proj, w(layer.post_attention_layernorm)]
            items += [w(layer.pre_feedforward_layernorm), mlp.gate_up_proj, mlp.down_proj]
            items.append(w(layer.post_feedforward_layernorm))
        scale = cast(Gemma3DecoderLayer, self.layers[0]).self_attn.scale
        windows = list(self.args.layer_windows)
        kinds = [1 if window is None else 0 for window in windows]  # rope pair: local, global
        self.decode_plan = plan_decode_layers(items, scale, windows, kinds, style_of(style))
        return self.decode_plan is not None

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        emb = self.embed_tokens(input_ids)
        # transformers scales by sqrt(hidden) rounded to the weights' dtype
        h = emb * torch.tensor(self.args.hidden_size**0.5, dtype=emb.dtype)
        plan = self.decode_plan
        if plan is not None and plan.takes(meta, input_ids.shape[0]):
            rope: list[torch.Tensor] = []
            for kind in ("local", "global"):  # float32 [T, head_dim / 2] for this step's rows
                freqs = cast(RotaryEmbedding, self.ropes[kind]).freqs(positions)
                rope += [freqs.cos(), freqs.sin()]
            rows = torch.arange(input_ids.shape[0])  # row t of the tables is token t's
            residual = h.contiguous()
            out = plan.run(self.args, residual, rows, rope, kv_caches, meta, self.norm.eps)
            return self.norm(residual.add_(out))
        dtype = h.dtype
        cos_sin = {
            kind: cast(RotaryEmbedding, rope).cos_sin(positions, dtype)
            for kind, rope in self.ropes.items()
        }
        wide = self.ops.residual_dtype
        if wide is not None:
            h = h.to(wide)  # the residual stream (TorchOps.residual_dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            pair = cos_sin["local" if layer.is_local else "global"]
            h = layer(pair, h, kv_cache, meta, dtype)
        return self.norm(h, dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def greedy_tokens(self, hidden: torch.Tensor, vocab: int) -> torch.Tensor | None:
        # the softcap's tanh can round distinct logits to one value: no argmax of the raw ones
        return None if self.softcap is not None else head_argmax(self.lm_head, hidden, vocab)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked_weights(self, weights, self.args)
