"""QuantLinear: a drop-in for nn.Linear whose weight stays block-quantized.

At small batch a decode step is weight-bound: every token reads every weight once. A
4-bit block weight is ~0.6 bytes per parameter against 4 (float32) or 2 (bfloat16), so the
C++ kernels (scheduler_worker/kernels) read 3-6x fewer bytes per token; they quantize the
activations to 8 bits per block and do integer dot products, as llama.cpp does.

Without the kernels (no compiler) the layer multiplies by its dequantized weight in
pure torch: the same weight values, float activations, slower.

Large steps (prefill, big decode batches) are compute-bound. The AVX-512 VNNI kernel
(weights repacked 16 rows at a time) stays ahead of oneDNN's dense bf16 GEMM at every
step size measured (1 to 512 rows, docs/benchmarks.md, bench_quant.py), but the AVX2
kernel falls behind it past 8 rows on a CPU with native bfloat16 (AVX512-BF16). Where
that happens, and on AMX CPUs (whose bf16 tile GEMMs were not measured here), the layer
can keep a bfloat16 copy of the dequantized weight (`dense_dtype`): the same weight values,
bfloat16 activations, ~3-4x the weight memory. The engine keeps it only when asked
(`--prefill-dense-copy`, quant/plan.py): by default the weights are the file's bytes.

Which rows take the dense copy is decided by what the tokens are, not by how many share
the step, so that a request's numbers do not depend on its neighbours (a seeded sample
repeats): under the engine (`StepRows`, set by the model runner every step) prompt tokens
always take the dense copy and decode tokens the integer kernels, unless more than
`DENSE_ABOVE_ROWS` sequences decode together (a large batch: all dense). Used alone, a
layer sends steps of more than `dense_above` rows to the dense copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scheduler_worker import kernels
from scheduler_worker.quant import weight_arena
from scheduler_worker.quant.formats import (
    FMT_CODES,
    BlockWeight,
    dequantize,
    pack_blocks,
    quantize_q4,
    quantize_q8,
)

QUANT_METHODS = ("none", "int8", "int4", "gguf")
# rows per step above which a layer with a dense bf16 copy uses it: measured with the AVX2
# kernel on an AVX512-BF16 EPYC (bench_quant.py), where the crossover sat between 8 and 16
DENSE_ABOVE_ROWS = 8


def dense_dtype_for(isa: str, native_bf16: bool, amx: bool) -> torch.dtype | None:
    """bfloat16 where a dense bf16 GEMM beats kernel path `isa` on large steps: a CPU with
    native bf16 matmuls whose path is not AVX-512 VNNI, or one with AMX. None elsewhere:
    float32 GEMMs lose to the integer kernels at every size measured, and so does the
    AVX512-BF16 GEMM to the VNNI kernel."""
    if not native_bf16 or (isa == "avx512" and not amx):
        return None
    return torch.bfloat16


class StepRows:
    """Shared by a model's QuantLinears: how many leading rows of this step's activations
    go through the integer kernels (the decode tokens, which come first), the rest through
    the dense copy. None: decide by the row count alone."""

    def __init__(self) -> None:
        self.kernel_rows: int | None = None

    def set_step(self, num_decode: int) -> None:
        self.kernel_rows = num_decode if num_decode <= DENSE_ABOVE_ROWS else 0


class QuantLinear(nn.Module):
    qs: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None

    def __init__(
        self,
        weight: BlockWeight,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        isa: str | None,
        dense_dtype: torch.dtype | None = None,
        dense_above: int = DENSE_ABOVE_ROWS,
    ) -> None:
        """`isa`: the kernel path ("amx", "avx512", "avx2", "scalar"); None computes in pure torch.
        `dense_dtype`: keep a dense copy in this dtype for steps of > `dense_above` rows."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.form, self.source = weight.form, weight.source
        self.isa = isa
        self.isa_index = kernels.isa_index(isa) if isa is not None else -1
        self.fmt = FMT_CODES[weight.form]
        # the kernels read the same values repacked 16 rows at a time (pack_blocks)
        qs, d, m = (weight.qs, weight.d, weight.m) if isa is None else pack_blocks(weight)
        if isa is not None:  # read every step: on huge pages (weight_arena.py)
            qs = weight_arena.hold(qs)
            d, m = weight_arena.hold_scales(d, m)
        self.register_buffer("qs", qs)
        self.register_buffer("d", d)
        self.register_buffer("m", m)
        self.dense: torch.Tensor | None = None
        self.dense_above = 0 if isa is None else dense_above
        if isa is None or dense_dtype is not None:
            self.dense = dequantize(weight).to(dtype if isa is None else dense_dtype)
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        )
        self.step_rows: StepRows | None = None  # set by the model runner

    def kernel_rows(self, rows: int) -> int:
        """How many of a step's `rows` (the leading ones) the integer kernels take."""
        if self.dense is None:
            return rows
        if self.isa is None:
            return 0
        if self.step_rows is not None and self.step_rows.kernel_rows is not None:
            return min(rows, self.step_rows.kernel_rows)
        return rows if rows <= self.dense_above else 0

    def kernel_tensors(self) -> list[torch.Tensor]:
        """qs, d, m, bias for torch.ops.zeroserve.decode_layers (empty tensors for none)."""
        none = torch.empty(0, dtype=self.d.dtype)
        return [
            self.qs,
            self.d,
            self.m if self.m is not None else none,
            none if self.bias is None else self.bias,
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        kernel_rows = self.kernel_rows(rows)
        if kernel_rows == rows:
            y = self._kernel(x2)
        elif kernel_rows == 0:
            y = self._dense(x2)
        else:
            y = torch.cat([self._kernel(x2[:kernel_rows]), self._dense(x2[kernel_rows:])])
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def argmax(self, x: torch.Tensor, n: int) -> torch.Tensor | None:
        """int64 [rows]: the index of each row's largest output among the first n, the one
        forward(x)[:, :n].max(dim=-1) gives, bit for bit, without writing the outputs out
        (torch.ops.zeroserve.qlinear_argmax). None where that op does not serve this layer:
        pure torch, a bias, rows for the dense copy."""
        x2 = x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        if self.isa is None or self.bias is not None:
            return None
        if self.kernel_rows(rows) != rows:
            return None
        n = min(n, self.out_features)
        return torch.ops.zeroserve.qlinear_argmax(
            x2, self.qs, self.d, self.m, self.fmt, n, self.isa_index
        )

    def _kernel(self, x2: torch.Tensor) -> torch.Tensor:
        return torch.ops.zeroserve.qlinear(
            x2, self.qs, self.d, self.m, self.fmt, self.out_features, self.isa_index
        )

    def _dense(self, x2: torch.Tensor) -> torch.Tensor:
        assert self.dense is not None
        return F.linear(x2.to(self.dense.dtype), self.dense).to(x2.dtype)

    def extra_repr(self) -> str:
        path = self.isa or "pure torch"
        return f"{self.in_features}, {self.out_features}, {self.source} as {self.form}, {path}"


def quantize_weight(w: torch.Tensor, method: str) -> BlockWeight:
    if method == "int4":
        return quantize_q4(w)
    if method == "int8":
        return quantize_q8(w)
    raise ValueError(f"cannot quantize a float weight with method {method!r}")


def replace_linear(
    model: nn.Module,
    name: str,
    weight: BlockWeight,
    dtype: torch.dtype,
    isa: str | None,
    dense_dtype: torch.dtype | None = None,
) -> QuantLinear:
    """Swap the nn.Linear at `name` for a QuantLinear of `weight` (keeping its bias)."""
    parent_name, _, attr = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, attr)
    if not isinstance(old, nn.Linear) or (old.out_features, old.in_features) != weight.shape:
        raise ValueError(f"{name}: expected an nn.Linear of shape {weight.shape}, found {old}")
    new = QuantLinear(weight, old.bias, dtype, isa, dense_dtype)
    setattr(parent, attr, new)
    return new


def quantize_model(
    model: nn.Module,
    method: str,
    dtype: torch.dtype,
    isa: str | None,
    dense_dtype: torch.dtype | None = None,
) -> int:
    """Quantize every nn.Linear of a float model in place; returns how many.

    With int4 the output projection (`lm_head`) gets int8: 4 bits on the vocab projection
    visibly change greedy text, and the GGUF files int4 stands in for keep it wider too
    (the default model's is Q4_1 everywhere but the tied embedding/output, Q8_0).
    """
    targets = [name for name, mod in model.named_modules() if isinstance(mod, nn.Linear)]
    for name in targets:
        linear = model.get_submodule(name)
        assert isinstance(linear, nn.Linear)
        m = "int8" if method == "int4" and name.rpartition(".")[2] == "lm_head" else method
        replace_linear(model, name, quantize_weight(linear.weight, m), dtype, isa, dense_dtype)
    return len(targets)
