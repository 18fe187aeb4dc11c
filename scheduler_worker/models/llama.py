"""The llama-layout decoder in plain torch, the shared layers of every family whose
`layers` is "decoder" (common/families): Llama, SmolLM2, Mistral (sliding window), Qwen2
(q/k/v bias), Qwen 3 (QK-norm: q and k RMS-normed per head before RoPE), Phi-3
(checkpoints with qkv_proj and gate_up_proj already fused load as they are). Its knobs
are ModelArgs' fields: biases, QK-norm, windows, and the embedding, attention, residual
and logit multipliers (Granite's).

Hugging Face weight names are mapped on load; q/k/v and gate/up projections are stacked
into one matmul each (fewer, larger GEMMs per layer).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.ops import TORCH_OPS, TorchOps
from scheduler_worker.models.common import (
    AttentionProjections,
    CausalLM,
    ModelArgs,
    head_argmax,
    load_stacked_weights,
    rope_scaling_of,
    rope_theta_of,
)
from scheduler_worker.models.decode_plan import DecodePlan, plan_decode_layers, style_of
from scheduler_worker.rope import RotaryEmbedding


class RMSNorm(nn.Module):
    """`norm(x)`, or with a residual stream `norm(x, residual)`: residual += x (in place)
    and the sum is normalized, so the add and the norm are one pass in the fused kernel."""

    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return self.ops.rms_norm(x, residual, self.weight, self.eps)


class LlamaAttention(AttentionProjections):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs, layer_index: int = 0) -> None:
        super().__init__(args, layer_index)
        multiplier = args.attention_multiplier
        self.scale = self.head_dim**-0.5 if multiplier is None else multiplier
        self.qk_norm = args.qk_norm
        if args.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, args.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, args.norm_eps)

    def _norm_qk(self, qkv: torch.Tensor) -> None:
        """QK-norm in place on the q and k columns of qkv, so both rope paths follow."""
        t = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(t * self.num_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(
            t * self.num_kv_heads, self.head_dim
        )
        qkv[:, : self.q_size] = self.q_norm(q).view(t, self.q_size)
        qkv[:, self.q_size : self.q_size + self.kv_size] = self.k_norm(k).view(t, self.kv_size)

    def forward(self, rope, x, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """rope: what the op set's rope_inputs() made for this step (once for all layers)."""
        qkv = self.qkv_proj(x)
        if self.qk_norm:
            self._norm_qk(qkv)
        # rotate q, k and write k, v into the cache (one pass where the op set fuses it)
        q, k, v = self.ops.rope_write_kv(
            qkv, rope, kv_cache, meta, self.num_heads, self.num_kv_heads
        )
        o = self.ops.attention(q, k, v, kv_cache, meta, self.scale, self.window)
        return self.o_proj(o.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(
            args.hidden_size, 2 * args.intermediate_size, bias=args.mlp_bias
        )
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)
        self.act = args.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.act_mul(self.gate_up_proj(x), self.act))


def residual_stream(h: torch.Tensor, dtype: torch.dtype | None):
    """(residual, x) for the first layer from the embeddings h: h itself, or, where the op
    set keeps the stream wider than the model's dtype, zeros of that dtype with h as the
    first x, so the first norm's fused add takes h in exactly (and gives h's dtype)."""
    if dtype is None or dtype == h.dtype:
        return h, None
    return torch.zeros(h.shape, dtype=dtype, device=h.device), h


class LlamaDecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_index: int = 0) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.self_attn = LlamaAttention(args, layer_index)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.norm_eps)
        self.mlp = LlamaMLP(args)
        self.residual_multiplier = args.residual_multiplier

    def forward(self, cos_sin, x, residual, kv_cache, meta) -> torch.Tensor:
        """x: the previous layer's MLP output (None for the first layer), added here into
        `residual` (the running hidden state, updated in place); returns this layer's MLP
        output (each output scaled by residual_multiplier first, where it is not 1)."""
        normed = self.input_layernorm(residual) if x is None else self.input_layernorm(x, residual)
        h = self.self_attn(cos_sin, normed, kv_cache, meta)
        m = self.residual_multiplier
        if m != 1.0:
            h = h * m
        out = self.mlp(self.post_attention_layernorm(h, residual))
        return out if m == 1.0 else out * m


class LlamaForCausalLM(CausalLM):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.rope = self._make_rope()  # cos/sin computed once per forward, for every layer
        self.decode_plan: DecodePlan | None = None  # set by enable_decode_layers()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.post_init()

    def _make_rope(self) -> RotaryEmbedding:
        a = self.args
        return RotaryEmbedding(
            a.head_dim,
            a.max_position_embeddings,
            rope_theta_of(a.hf_config),
            rope_scaling_of(a.hf_config),
        )

    def post_init(self) -> None:
        """Tie lm_head to the embeddings and (re)build the rope tables on the real device."""
        tied_modules = isinstance(self.lm_head, nn.Linear) and isinstance(
            self.embed_tokens, nn.Embedding
        )  # a GGUF model's are modules over the file's tensor (scheduler_worker.loader)
        if self.args.tie_word_embeddings and tied_modules:
            self.lm_head.weight = self.embed_tokens.weight
        if self.norm.weight.device.type != "meta":
            self.rope = self._make_rope()

    def enable_decode_layers(self) -> bool:
        """Run decode steps whose linears all take the integer kernels as one C++ call
        (torch.ops.zeroserve.decode_layers: the same ops as the modules, without the
        Python between them). Needs a family that takes it (decode_style), the C++ op
        set, SiLU, no residual multiplier, and every decoder linear a QuantLinear on one
        kernel path; returns whether the plan was made."""
        a = self.args
        if a.decode_style is None or self.ops.kernel_isa is None or a.residual_multiplier != 1:
            return False
        if a.hidden_act not in ("silu", "swish"):
            return False  # the op's activations: SiLU here (GELU-tanh: Gemma 3)
        items: list[torch.Tensor | nn.Module] = []
        for layer in cast(list[LlamaDecoderLayer], list(self.layers)):
            attn, mlp = layer.self_attn, layer.mlp
            items.append(layer.input_layernorm.weight)
            if attn.qk_norm:
                items += [attn.q_norm.weight, attn.k_norm.weight]
            items += [attn.qkv_proj, attn.o_proj, layer.post_attention_layernorm.weight]
            items += [mlp.gate_up_proj, mlp.down_proj]
        scale = cast(LlamaDecoderLayer, self.layers[0]).self_attn.scale
        layers = len(self.layers)
        windows: list[int | None] = list(self.args.layer_windows or [None] * layers)
        style = style_of(a.decode_style)
        self.decode_plan = plan_decode_layers(items, scale, windows, [0] * layers, style)
        return self.decode_plan is not None

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.args.embedding_multiplier != 1.0:
            h = h * self.args.embedding_multiplier
        rope = self.ops.rope_inputs(self.rope, positions, h.dtype)
        plan = self.decode_plan
        if plan is not None and plan.takes(meta, input_ids.shape[0]):
            tables = list(self.rope.tables_f32())
            out = plan.run(self.args, h, positions, tables, kv_caches, meta, self.norm.eps)
            return self.norm(out, h)
        # x: the previous layer's MLP output, added into the residual by the next norm
        residual, x = residual_stream(h, self.ops.residual_dtype)
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(rope, x, residual, kv_cache, meta)
        return self.norm(x, residual)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        scaling = self.args.logits_scaling
        return logits if scaling == 1.0 else logits / scaling

    def greedy_tokens(self, hidden: torch.Tensor, vocab: int) -> torch.Tensor | None:
        if self.args.logits_scaling <= 0:  # a positive one keeps the argmax
            return None
        return head_argmax(self.lm_head, hidden, vocab)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked_weights(self, weights, self.args)
