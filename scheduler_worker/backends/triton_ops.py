"""`TritonOps`, the GPU backend's layer ops, and the Triton kernels for the elementwise
parts of one decoder layer: three fused ops, each one launch over a flat token dimension T
(contiguous rows):

- `rms_norm`: optional residual add (in place) then RMS normalization, Llama or Gemma style;
- `act_mul`: SiLU / GELU-tanh of the gate half times the up half of a fused gate_up row;
- `rope_write_kv`: rotate-half RoPE of the q and k heads of a fused qkv row, and the write
  of k (rotated) and v into the paged KV cache at each token's slot.

Every function launches with grid sizes from host ints and tensor shapes only and never
reads a device value on the host, so each can be captured in a CUDA graph. Math is float32
inside the kernels; results are rounded to the dtype stated per function. The kernels also
run under `TRITON_INTERPRET=1` on CPU tensors, which is how the tests exercise them without
a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from scheduler_worker.activations import GELU_TANH_ACTS
from scheduler_worker.backends import triton_decode, triton_fp8, triton_prefill
from scheduler_worker.backends.gemv_choice import GemvRoutes
from scheduler_worker.backends.ops import TorchOps
from scheduler_worker.backends.triton_attention import cache_strides

NUM_WARPS = 4  # a launch parameter only; the interpreter ignores it
FP8_KV_MAX = 448.0  # E4M3's largest value: an FP8 cache's K/V saturate there (scale 1)


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    stride_x,
    stride_res,
    stride_out,
    D,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    GEMMA: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_res + offs, mask=mask, other=0.0)
        # residual.add_(x): float32 sum rounded to the residual's dtype, stored back
        r = (r.to(tl.float32) + x.to(tl.float32)).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_res + offs, r, mask=mask)
        x = r
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / D
    y = xf * tl.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        out = y * (1.0 + w)
    else:
        # HF Llama: weight * x.to(dtype): round the normalized row first
        out = w * y.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float = 0.0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """RMS norm of x [T, D] (rows contiguous; any [..., D] without a residual), with an
    optional fused residual add.

    With `residual` [T, D]: `residual += x` in place (rounded to residual's dtype, as
    `residual.add_(x)`: a float32 residual takes a bfloat16 x exactly), and the updated
    residual is normalized. The output has `out_dtype`, else x's dtype. `weight_offset` 0.0
    is Llama's `weight * y.to(dtype)`; 1.0 is Gemma's `(y * (1 + weight)).to(dtype)`; no
    other value is supported.
    """
    if weight_offset not in (0.0, 1.0):
        raise ValueError(f"weight_offset must be 0.0 or 1.0, got {weight_offset}")
    if x.dim() != 2:  # e.g. Gemma 3's per-head q / k norms on [T, H, D]: rows of D
        assert residual is None, "a residual stream is [T, D]"
        rows = x.reshape(-1, x.shape[-1])  # a copy where the heads are a view into qkv
        return rms_norm(rows, None, weight, eps, weight_offset, out_dtype).view(x.shape)
    num_tokens, dim = x.shape
    assert x.stride(-1) == 1 and weight.shape == (dim,)
    src = x if residual is None else residual
    if residual is not None:
        assert residual.shape == x.shape and residual.stride(-1) == 1
    out = torch.empty((num_tokens, dim), dtype=out_dtype or x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    _rms_norm_kernel[(num_tokens,)](
        x,
        x if residual is None else residual,
        weight,
        out,
        x.stride(0),
        src.stride(0),
        out.stride(0),
        dim,
        eps,
        HAS_RESIDUAL=residual is not None,
        GEMMA=weight_offset == 1.0,
        BLOCK_D=triton.next_power_of_2(dim),
        num_warps=NUM_WARPS if dim <= 4096 else 8,
    )
    return out


@triton.jit
def _act_mul_kernel(
    gu_ptr,
    out_ptr,
    stride_gu,
    stride_out,
    inter,
    GELU_TANH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(gu_ptr + row * stride_gu + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * stride_gu + inter + offs, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        # 0.5 x (1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
        u = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = gate / (1.0 + tl.exp(-2.0 * u))
    else:
        act = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * stride_out + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


def act_mul(gate_up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up for gate_up [T, 2I] = [gate | up]; returns [T, I] in gate_up's dtype.

    `act` is "silu" or "gelu_tanh" (the tanh approximation of GELU). Float32 math.
    """
    if act not in ("silu", "gelu_tanh"):
        raise ValueError(f"unsupported activation {act!r}")
    num_tokens, two_i = gate_up.shape
    assert two_i % 2 == 0 and gate_up.stride(-1) == 1
    inter = two_i // 2
    out = torch.empty((num_tokens, inter), dtype=gate_up.dtype, device=gate_up.device)
    if num_tokens == 0:
        return out
    block = min(1024, triton.next_power_of_2(inter))
    _act_mul_kernel[(num_tokens, triton.cdiv(inter, block))](
        gate_up,
        out,
        gate_up.stride(0),
        out.stride(0),
        inter,
        GELU_TANH=act == "gelu_tanh",
        BLOCK=block,
        num_warps=NUM_WARPS,
    )
    return out


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    cos,
    sin,
    num_heads,
    head_dim,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    """Rotate-half RoPE of `num_heads` contiguous heads at src into dst (same layout);
    returns the rotated halves in float32 ([BLOCK_H, BLOCK_HALF] each) and their mask."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < half)
    offs = offs_h[:, None] * head_dim + offs_d[None, :]
    x1 = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_ptr + offs + half, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst_ptr + offs, o1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst_ptr + offs + half, o2.to(dst_ptr.dtype.element_ty), mask=mask)
    return o1, o2, mask


@triton.jit
def _rope_write_kv_kernel(
    qkv_ptr,
    pos_ptr,
    cos_ptr,
    sin_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qkv,
    stride_cos,
    kv_strides,
    num_heads,
    num_kv_heads,
    head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    KV_MAX: tl.constexpr,
):
    stride_kc_b, stride_kc_r, stride_kc_h, stride_vc_b, stride_vc_r, stride_vc_h = kv_strides
    tok = tl.program_id(0).to(tl.int64)
    half = head_dim // 2
    offs_d = tl.arange(0, BLOCK_HALF)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=offs_d < half, other=0.0)
    sin = tl.load(sin_ptr + pos * stride_cos + offs_d, mask=offs_d < half, other=0.0)
    cos = cos.to(tl.float32)
    sin = sin.to(tl.float32)
    row = qkv_ptr + tok * stride_qkv
    q_width = num_heads * head_dim
    kv_width = num_kv_heads * head_dim
    _rotate_heads(
        row, q_out_ptr + tok * q_width, cos, sin, num_heads, head_dim, half, BLOCK_H, BLOCK_HALF
    )
    k1, k2, k_mask = _rotate_heads(
        row + q_width,
        k_out_ptr + tok * kv_width,
        cos,
        sin,
        num_kv_heads,
        head_dim,
        half,
        BLOCK_KV_H,
        BLOCK_HALF,
    )
    # the cache write; a negative slot is a padding row and writes nothing
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    block = tl.maximum(slot, 0) // BLOCK_SIZE
    blk_row = tl.maximum(slot, 0) % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_KV_H)
    # as a tensor: the interpreter rejects a scalar bool inside a mask
    write = (tl.zeros([BLOCK_KV_H, BLOCK_HALF], dtype=tl.int64) + slot) >= 0
    kc = k_cache_ptr + block * stride_kc_b + blk_row * stride_kc_r
    kc_offs = offs_h[:, None] * stride_kc_h + offs_d[None, :]
    k_dtype = k_cache_ptr.dtype.element_ty
    if KV_MAX > 0:  # an FP8 cache (scale 1): saturate, E4M3 has no infinity
        k1 = tl.clamp(k1.to(tl.float32), -KV_MAX, KV_MAX)
        k2 = tl.clamp(k2.to(tl.float32), -KV_MAX, KV_MAX)
    tl.store(kc + kc_offs, k1.to(k_dtype), mask=k_mask & write)
    tl.store(kc + kc_offs + half, k2.to(k_dtype), mask=k_mask & write)
    v_src = row + q_width + kv_width + offs_h[:, None] * head_dim + offs_d[None, :]
    vc = v_cache_ptr + block * stride_vc_b + blk_row * stride_vc_r
    vc_offs = offs_h[:, None] * stride_vc_h + offs_d[None, :]
    v_dtype = v_cache_ptr.dtype.element_ty
    v1 = tl.load(v_src, mask=k_mask, other=0.0)
    v2 = tl.load(v_src + half, mask=k_mask, other=0.0)
    if KV_MAX > 0:
        v1 = tl.clamp(v1.to(tl.float32), -KV_MAX, KV_MAX)
        v2 = tl.clamp(v2.to(tl.float32), -KV_MAX, KV_MAX)
    tl.store(vc + vc_offs, v1.to(v_dtype), mask=k_mask & write)
    tl.store(vc + vc_offs + half, v2.to(v_dtype), mask=k_mask & write)


def rope_write_kv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on q and k of a fused qkv row, and the K/V cache write, in one launch.

    qkv [T, (H + 2 Hkv) * Dh] holds [q heads | k heads | v heads], rows contiguous;
    positions [T] and slot_mapping [T] are int32 or int64; cos / sin [P, Dh / 2] float32
    tables indexed by position. Rotate-half (Hugging Face Llama) layout: with x1, x2 the
    two halves of a head, out = [x1 c - x2 s, x2 c + x1 s], in float32 rounded to qkv's
    dtype. The rotated k and the unrotated v go to k_cache / v_cache [NB, BS, Hkv, Dh] at
    block slot // BS, row slot % BS, cast to the cache dtype (an FP8 cache: scale 1,
    saturated at +-448); a negative slot (padding row)
    writes nothing. Returns q [T, H, Dh] and k [T, Hkv, Dh] (rotated), new tensors.
    """
    num_tokens = qkv.shape[0]
    head_dim = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    assert qkv.shape[1] == (num_heads + 2 * num_kv_heads) * head_dim and head_dim % 2 == 0
    assert qkv.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride() == cos.stride()
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and k_cache.stride(-1) == 1
    assert v_cache.shape == k_cache.shape and v_cache.stride(-1) == 1
    block_size = k_cache.shape[1]
    q = torch.empty((num_tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    k = torch.empty((num_tokens, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q, k
    _rope_write_kv_kernel[(num_tokens,)](
        qkv,
        positions,
        cos,
        sin,
        k_cache,
        v_cache,
        slot_mapping,
        q,
        k,
        qkv.stride(0),
        cos.stride(0),
        cache_strides(k_cache, v_cache),
        num_heads,
        num_kv_heads,
        head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=triton.next_power_of_2(num_heads),
        BLOCK_KV_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
        KV_MAX=FP8_KV_MAX if k_cache.dtype == torch.float8_e4m3fn else 0.0,
        num_warps=NUM_WARPS,
    )
    return q, k


class TritonOps(TorchOps):
    """The layer ops on a GPU: one Triton kernel each (above), attention straight from the
    paged cache (backends/triton_decode.py, triton_prefill.py)."""

    name = "triton"
    # the running hidden state in float32 between layers, whatever the model's dtype: a
    # bfloat16 one rounds at every layer's two adds, the largest part of bf16's distance
    # from float32 (docs/benchmarks.md, "A float32 residual stream"); it costs 4 bytes a
    # hidden unit a token where bf16 takes 2, next to the weights' 2 bytes a parameter
    residual_dtype = torch.float32

    def __init__(self, gemv: str = "auto") -> None:
        self.gemv = GemvRoutes(gemv)  # the few-row linears' measured route (gemv_choice.py)

    def linear(self, x, weight, bias=None):
        return self.gemv.linear(x, weight, bias)

    def rms_norm(self, x, residual, weight, eps, weight_offset=0.0, out_dtype=None):
        return rms_norm(x, residual, weight, eps, weight_offset, out_dtype)

    def fp8_matmul(self, x, qw, sw, bias):
        return triton_fp8.scaled_mm(x, qw, sw, bias)

    def act_mul(self, gate_up, act):
        if act in ("silu", "swish"):
            return act_mul(gate_up, "silu")
        if act in GELU_TANH_ACTS:
            return act_mul(gate_up, "gelu_tanh")
        return super().act_mul(gate_up, act)

    def rope_inputs(self, rope, positions, dtype):
        if not rope.table:  # computed per step (Gemma 3's long context): the torch path
            return super().rope_inputs(rope, positions, dtype)
        return (positions, *rope.tables_f32())

    def rope_write_kv(self, qkv, rope, kv_cache, meta, num_heads, num_kv_heads):
        if len(rope) == 2:
            return super().rope_write_kv(qkv, rope, kv_cache, meta, num_heads, num_kv_heads)
        positions, cos, sin = rope
        q, k = rope_write_kv(
            qkv, positions, cos, sin, kv_cache[0], kv_cache[1], meta.slot_mapping,
            num_heads, num_kv_heads,
        )  # fmt: skip
        t, head_dim = qkv.shape[0], kv_cache[0].shape[-1]
        v = qkv[:, (num_heads + num_kv_heads) * head_dim :].view(t, num_kv_heads, head_dim)
        return q, k, v

    def attention(self, q, k, v, kv_cache, meta, scale, window=None):
        if meta.decode_block_tables is not None and meta.num_decode == q.shape[0]:
            assert meta.decode_context_lens is not None
            return triton_decode.paged_decode_attention(
                q, kv_cache[0], kv_cache[1], meta.decode_block_tables, meta.decode_context_lens,
                scale, window or 0, num_splits=meta.num_splits,
            )  # fmt: skip
        assert meta.query_start_loc is not None and meta.seq_lens is not None
        assert meta.block_tables is not None
        return triton_prefill.paged_prefill_attention(
            q, kv_cache[0], kv_cache[1], meta.block_tables, meta.query_start_loc, meta.seq_lens,
            scale, window or 0,
        )  # fmt: skip
