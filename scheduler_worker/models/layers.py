"""The shared decoder layers in plain torch, put together by a family's LayerRecipe
(common/families/base.py) with its checkpoint's numbers (ModelArgs):

    norm       RMSNorm (gain w, or 1 + w in float32: norm_weight_offset) or LayerNorm
               with bias
    attention  stacked q/k/v; QK-norm per head or over all heads (qk_norm); RoPE on each
               head's first rotary_dim dims (none: learned positions); the softmax scale;
               the layer's window
    mlp        act(gate) * up (gated_mlp), else act(up)
    layer      pre_norm:           h += attn(norm(h));   h += mlp(norm(h))
               post_norm:          h += norm(attn(h));   h += norm(mlp(h))
               both:               h += norm(attn(norm(h)));   h += norm(mlp(norm(h)))
               parallel_residual:  h += attn(norm(h)) + mlp(norm'(h))
               (attention and MLP outputs times residual_multiplier where it is not 1)

Module names are Hugging Face's, so checkpoints load by name: the MLP's input norm is
`post_attention_layernorm` in the pre-norm layout and `pre_feedforward_layernorm` beside
post norms, where `post_attention_layernorm` is the attention output's norm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scheduler_worker.activations import ACTIVATIONS
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.ops import TORCH_OPS, Linear, TorchOps
from scheduler_worker.models.common import AttentionProjections, ModelArgs
from scheduler_worker.rope import rotate


class RMSNorm(nn.Module):
    """`norm(x)`, or with a residual stream `norm(x, residual)`: residual += x (in place)
    and the sum is normalized, so the add and the norm are one pass in the fused kernel."""

    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - weight_offset))  # identity gain
        self.eps = eps
        self.weight_offset = weight_offset  # 1.0: the gain is 1 + weight

    def forward(self, x, residual=None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """out_dtype: a wide residual stream's norm in the model's dtype (else x's)."""
        return self.ops.rms_norm(x, residual, self.weight, self.eps, self.weight_offset, out_dtype)


class LayerNorm(nn.Module):
    """LayerNorm with bias, computed in float32, with RMSNorm's call shape."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x, residual=None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        dtype = out_dtype or x.dtype
        if residual is not None:
            x = residual.add_(x)
        w, b = self.weight.float(), self.bias.float()
        return F.layer_norm(x.float(), w.shape, w, b, self.eps).to(dtype)


def make_norm(args: ModelArgs, dim: int) -> nn.Module:
    r = args.recipe
    if r.norm == "layer_norm":
        return LayerNorm(dim, args.norm_eps)
    return RMSNorm(dim, args.norm_eps, r.norm_weight_offset)


class Attention(AttentionProjections):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs, layer_index: int = 0) -> None:
        super().__init__(args, layer_index)
        scale = args.attention_scale
        self.scale = self.head_dim**-0.5 if scale is None else scale
        self.rotary_dim = args.rotary_dim
        self.qk_norm = args.recipe.qk_norm
        eps, offset = args.norm_eps, args.recipe.norm_weight_offset
        if self.qk_norm is not None:  # each head's dims, or all of q's and all of k's
            full = self.qk_norm == "full"
            q_dim, k_dim = (self.q_size, self.kv_size) if full else (self.head_dim,) * 2
            self.q_norm = RMSNorm(q_dim, eps, offset)
            self.k_norm = RMSNorm(k_dim, eps, offset)

    def _norm_qk(self, qkv: torch.Tensor) -> None:
        """QK-norm in place on the q and k columns of qkv, so both rope paths follow."""
        t, q_size, kv_size = qkv.shape[0], self.q_size, self.kv_size
        q, k = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
        if self.qk_norm == "head":
            q = q.reshape(t * self.num_heads, self.head_dim)
            k = k.reshape(t * self.num_kv_heads, self.head_dim)
        qkv[:, :q_size] = self.q_norm(q).view(t, q_size)
        qkv[:, q_size : q_size + kv_size] = self.k_norm(k).view(t, kv_size)

    def _partial_rope_write_kv(self, qkv, cos_sin, kv_cache, meta: AttentionMetadata):
        """RoPE on each head's first rotary_dim dims (cos_sin: the torch pair; none where
        rotary_dim is 0), the rest as they are; k and v written into the cache."""
        t, d, r = qkv.shape[0], self.head_dim, self.rotary_dim
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, d)
        if r:
            qk = torch.cat((rotate(qk[..., :r], *cos_sin), qk[..., r:]), dim=-1)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, d)
        self.ops.write_kv(k, v, kv_cache, meta)
        return q, k, v

    def forward(self, rope, x, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """rope: what the op set's rope_inputs() made for this step (once for all layers)."""
        qkv = self.qkv_proj(x)
        if self.qk_norm is not None:
            self._norm_qk(qkv)
        if self.rotary_dim == self.head_dim:  # one pass where the op set fuses it
            q, k, v = self.ops.rope_write_kv(
                qkv, rope, kv_cache, meta, self.num_heads, self.num_kv_heads
            )
        else:
            q, k, v = self._partial_rope_write_kv(qkv, rope, kv_cache, meta)
        o = self.ops.attention(q, k, v, kv_cache, meta, self.scale, self.window)
        return self.o_proj(o.reshape(-1, self.q_size))


class MLP(nn.Module):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        hidden, inter, bias = args.hidden_size, args.intermediate_size, args.mlp_bias
        self.gated = args.recipe.gated_mlp
        if self.gated:
            self.gate_up_proj = Linear(hidden, 2 * inter, bias=bias)
        else:
            self.up_proj = Linear(hidden, inter, bias=bias)
        self.down_proj = Linear(inter, hidden, bias=bias)
        self.act = args.hidden_act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.down_proj(self.ops.act_mul(self.gate_up_proj(x), self.act))
        return self.down_proj(ACTIVATIONS[self.act](self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer_index: int = 0) -> None:
        super().__init__()
        r = args.recipe
        self.pre_norm, self.post_norm, self.parallel = r.pre_norm, r.post_norm, r.parallel_residual
        # the pre-norm layout alone: each input norm adds the previous output in one pass
        self.fused = r.pre_norm and not r.post_norm and not r.parallel_residual
        dim = args.hidden_size
        if r.pre_norm:
            self.input_layernorm = make_norm(args, dim)
        self.self_attn = Attention(args, layer_index)
        if r.post_norm:
            self.post_attention_layernorm = make_norm(args, dim)
        self.mlp_norm_name = (
            "pre_feedforward_layernorm" if r.post_norm else "post_attention_layernorm"
        )
        if r.pre_norm:
            setattr(self, self.mlp_norm_name, make_norm(args, dim))
        self.mlp = MLP(args)
        if r.post_norm:
            self.post_feedforward_layernorm = make_norm(args, dim)
        self.residual_multiplier = args.residual_multiplier

    @property
    def mlp_norm(self) -> nn.Module:
        return getattr(self, self.mlp_norm_name)

    def _scaled(self, out: torch.Tensor) -> torch.Tensor:
        m = self.residual_multiplier
        return out if m == 1.0 else out * m

    def forward_fused(self, rope, x, residual, kv_cache, meta) -> torch.Tensor:
        """The pre-norm layout: x the previous layer's MLP output (None for the first
        layer), added here into `residual` (the running hidden state, updated in place);
        returns this layer's MLP output."""
        normed = self.input_layernorm(residual) if x is None else self.input_layernorm(x, residual)
        h = self._scaled(self.self_attn(rope, normed, kv_cache, meta))
        return self._scaled(self.mlp(self.mlp_norm(h, residual)))

    def forward(self, rope, h, kv_cache, meta, dtype: torch.dtype) -> torch.Tensor:
        """Any layout: h the residual stream (the op set's residual_dtype where it has
        one, else the model's `dtype`), returned updated; the branches run in `dtype`."""
        x = self.input_layernorm(h, out_dtype=dtype) if self.pre_norm else h.to(dtype)
        a = self.self_attn(rope, x, kv_cache, meta)
        if self.post_norm:
            a = self.post_attention_layernorm(a)
        if self.parallel:
            m = self.mlp(self.mlp_norm(h, out_dtype=dtype))
            return h + (self._scaled(m) + self._scaled(a))
        h = h + self._scaled(a)
        m = self.mlp(self.mlp_norm(h, out_dtype=dtype) if self.pre_norm else h.to(dtype))
        if self.post_norm:
            m = self.post_feedforward_layernorm(m)
        return h + self._scaled(m)
