"""Loading a model: its weights, in the form the plan picks, onto the device.

    model dir ──plan_weights──▶ "none" | "int8"/"int4" | "fp8" | "gguf"
      "none", "int8"/"int4",  built on the meta device, float weights loaded (a GGUF model's
      "fp8":                  matrices dequantized from the file), then quantized if asked
      "gguf":                 built on the meta device; every linear and the embedding
                              swapped for modules over the file's own tensors (memory
                              map); only the norms and biases are allocated as float and
                              loaded from the conversion cache
      an FP8 checkpoint:      its E4M3 linears as stored (quant/fp8_checkpoint.py), or
                              dequantized (--quantization none)

So the default path never holds a float copy of a quantized matrix: the scheduler's weight
memory is the file's (WeightMemory, logged at start and exported in /metrics).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from common.config import EngineConfig
from common.log import get_logger
from common.model_files.gguf_convert import gguf_matrices
from common.model_files.model_source import (
    check_quantization_source,
    check_weight_source,
    checkpoint_fp8_layout,
    gguf_source,
)
from scheduler_worker.backends.device import builds_on_host, resolve_device, resolve_dtype
from scheduler_worker.dummy_weights import fill_random
from scheduler_worker.models import (
    MODEL_REGISTRY,
    architecture_of,
    iter_safetensors,
    servable_args,
)
from scheduler_worker.models.common import CausalLM, ModelArgs
from scheduler_worker.parallel.group import tp_group
from scheduler_worker.parallel.layers import shard_modules
from scheduler_worker.parallel.partition import Partition, plan_partition
from scheduler_worker.parallel.weights import gguf_shards, iter_safetensors_shard
from scheduler_worker.quant.dequant_linear import DequantLinear
from scheduler_worker.quant.embedding import QuantEmbedding
from scheduler_worker.quant.fp8 import (
    FP8_KEEP,
    FP8_KEEP_LAST_LAYERS,
    Fp8Linear,
    quantize_model_fp8,
)
from scheduler_worker.quant.fp8_checkpoint import (
    dequantize_fp8,
    fp8_weight_shapes,
    fp8_weights,
    swap_in_fp8,
)
from scheduler_worker.quant.gguf_weights import GGUFBlocks, swap_in_gguf
from scheduler_worker.quant.linear import DENSE_ABOVE_ROWS, QuantLinear, quantize_model
from scheduler_worker.quant.mapped import drop_map_pages
from scheduler_worker.quant.plan import WeightPlan, plan_weights
from scheduler_worker.weight_report import WeightMemory, kernel_lines, weight_memory

log = get_logger("loader")

_QUANT_MODULES = (QuantLinear, DequantLinear, QuantEmbedding, Fp8Linear)


# nn.init's in-place initializers, as the torch.nn modules call them (init.normal_(w))
_INITS = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
)


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device without their random initialization. A meta
    tensor holds no data, so the init changes nothing; but nn.Embedding's normal_ on meta
    runs through a Python decomposition whose first call imports torch._dynamo (1.5-2.5 s
    of a scheduler's start on a 2-core machine). The initializers are swapped process-wide
    while it lasts: the loader builds before any other thread uses torch.nn."""
    saved = {name: getattr(nn.init, name) for name in _INITS}
    try:
        for name in _INITS:
            setattr(nn.init, name, _keep)
        with torch.device("meta"):
            yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _keep(tensor: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
    return tensor


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread for a while (then as before). The repacking of a GGUF file's
    blocks is many small memory-bound copies: a second thread gains little, and while the
    other processes of a start hold the other cores, torch's threads wait on each other at
    every op (Gemma 3 270M on 2 vCPUs with one busy: 11 s on two threads, 1.5 s on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class LoadedModel:
    model: CausalLM
    args: ModelArgs
    plan: WeightPlan
    dtype: torch.dtype
    device: torch.device
    memory: WeightMemory


def load(config: EngineConfig, model_dir: Path) -> LoadedModel:
    """The model of `model_dir` with its weights as `config` asks, eval mode, on its device."""
    device = resolve_device(config.model.device)
    dummy = config.model.load_format == "dummy"
    check_weight_source(config.model.load_format, model_dir)
    check_quantization_source(config.model.quantization, model_dir)
    gguf = gguf_source(model_dir)
    fp8 = checkpoint_fp8_layout(model_dir)
    plan = plan_weights(config.model, device, gguf, fp8 is not None)
    dtype = resolve_dtype(config.model.dtype, device, plan.method != "none")
    if plan.method != "none" and dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"quantized weights need dtype float32 or bfloat16, not {dtype}")
    t0 = time.perf_counter()
    hf = _read_config(model_dir)
    arch = architecture_of(hf)
    args = servable_args(hf, arch)
    tp = tp_group()  # tensor parallelism: this rank's shard (scheduler_worker/parallel/)
    part = plan_partition(args, tp.rank, tp.world) if tp is not None else None
    with on_meta():
        model = MODEL_REGISTRY[arch](args if part is None else part.local_args(args))
        if tp is not None and part is not None:
            shard_modules(model, part, tp)
    blocks = GGUFBlocks(gguf) if gguf is not None else None
    if fp8 is not None and not dummy:  # an FP8 checkpoint as stored (quant/fp8_checkpoint.py)
        shapes = fp8_weight_shapes(model_dir)
        n = swap_in_fp8(model, shapes, fp8)
        _cast_dense(model, dtype)  # on the meta device: the float parameters made in dtype
        model = model.to_empty(device=device)
        model.post_init()
        model.load_weights(fp8_weights(iter_safetensors(model_dir), fp8, shapes))
        _cast_dense(model, dtype)
        if plan.method == "none":
            dequantize_fp8(model, dtype)
        log.info("weights: %s, %d linears (%s)", fp8.describe(), n, plan.reason)
        return _loaded(model.eval(), args, plan, dtype, device, None, t0)
    if plan.method == "gguf":
        assert blocks is not None  # check_quantization_source / plan_weights
        with one_thread():
            served, mixed = swap_in_gguf(
                model, blocks, args.num_layers, dtype, plan.isa, plan.dense_dtype
            )
        _materialize(model, dtype)
        model.post_init()
        model.load_weights(iter_safetensors(model_dir))
        _cast_dense(model, dtype)
        model = model.eval()
        # every tensor was read through the file's map; nothing reads it now (quant/mapped.py)
        drop_map_pages(t.data for t in blocks.tensors.values())
        for line in kernel_lines(served):
            log.info("weights: %s", line)
        for m in mixed:
            log.info("weights: %s mixes GGUF types: served part by part (no float copy)", m)
        log.info(
            "weights: %d linears from the GGUF's own tensors, activations %s%s, in %.1fs (%s)",
            sum(isinstance(m, (QuantLinear, DequantLinear)) for m in model.modules()),
            str(dtype).removeprefix("torch."),
            _dense_note(plan),
            time.perf_counter() - t0,
            plan.reason,
        )
    else:
        # a GPU: the parameters made in the model's dtype on the device, and each tensor of
        # the checkpoint (a GGUF matrix dequantized one at a time) copied in and converted
        # there, so no float32 copy of the model is ever held on the host; random weights
        # (--load-format dummy) are made in the model's dtype on any device
        if not builds_on_host(device) or dummy:
            model = model.to(dtype=dtype)
        model = model.to_empty(device=device)
        model.post_init()  # re-tie weights and rebuild rope tables lost on the meta device
        if dummy:
            fill_random(model)
            log.info("weights: random, from config.json (--load-format dummy)")
            model = model.to(device=device, dtype=dtype).eval()  # buffers as a real load's
            _quantize_float(model, plan, dtype, t0)
            return _loaded(model, _local(args, part), plan, dtype, device, None, t0)
        weights = (
            iter_safetensors(model_dir)
            if part is None
            else iter_safetensors_shard(model_dir, part, args)
        )
        if gguf is not None:  # the lean cache has the norms; the matrices are in the file
            matrices = (
                (
                    (n, torch.from_numpy(np.require(a, requirements="W")))
                    for n, a in gguf_matrices(gguf)
                )
                if part is None
                else gguf_shards(gguf, part, args)
            )
            weights = itertools.chain(weights, matrices)
        model.load_weights(weights)
        model = model.to(device=device, dtype=dtype).eval()
        _quantize_float(model, plan, dtype, t0)
    return _loaded(model, _local(args, part), plan, dtype, device, blocks, t0)


def _local(args: ModelArgs, part: Partition | None) -> ModelArgs:
    """The shapes this process's modules and KV cache have (a rank's, under tensor
    parallelism)."""
    return args if part is None else part.local_args(args)


def _loaded(
    model: CausalLM,
    args: ModelArgs,
    plan: WeightPlan,
    dtype: torch.dtype,
    device: torch.device,
    blocks: GGUFBlocks | None,
    t0: float,
) -> LoadedModel:
    memory = weight_memory(model, blocks.tensor_bytes() if blocks is not None else None)
    log.info(
        "loaded %s (%s, %s) in %.1fs; %s",
        args.architecture,
        dtype,
        device,
        time.perf_counter() - t0,
        memory.describe(),
    )
    return LoadedModel(model, args, plan, dtype, device, memory)


def _read_config(model_dir: Path) -> dict:
    from common.model_facts import read_hf_config

    return read_hf_config(model_dir)


def _materialize(model: nn.Module, dtype: torch.dtype) -> None:
    """Allocate (uninitialized, on the CPU) what is still on the meta device after the
    swap: the norms, biases and rope tables, which the weight loader then fills."""
    for mod in model.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            if p.is_meta:
                setattr(mod, name, nn.Parameter(torch.empty(p.shape, dtype=dtype), False))
        for name, b in list(mod.named_buffers(recurse=False)):
            if b is not None and b.is_meta:
                mod._buffers[name] = torch.empty(b.shape, dtype=b.dtype)


def _cast_dense(model: nn.Module, dtype: torch.dtype) -> None:
    """The float tensors outside the quantized modules to `dtype` (model.to(dtype) would
    widen the kernels' float16 scales too)."""
    for mod in model.modules():
        if isinstance(mod, _QUANT_MODULES):
            continue
        for name, p in list(mod.named_parameters(recurse=False)):
            if p.is_floating_point() and p.dtype != dtype:
                setattr(mod, name, nn.Parameter(p.detach().to(dtype), False))
        for name, b in list(mod.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                mod._buffers[name] = b.to(dtype)


def _quantize_float(model: nn.Module, plan: WeightPlan, dtype: torch.dtype, t0: float) -> None:
    if plan.method == "none":
        log.info("weights: float %s (%s)", str(dtype).removeprefix("torch."), plan.reason)
        return
    if plan.method == "fp8":
        n = quantize_model_fp8(model, FP8_KEEP, FP8_KEEP_LAST_LAYERS)
        log.info(
            "weights: %d linears quantized to FP8 E4M3 per channel, the output head and the "
            "last %d decoder layer(s) kept in %s (%s)",
            n, FP8_KEEP_LAST_LAYERS, str(dtype).removeprefix("torch."), plan.reason,
        )  # fmt: skip
        return
    n = quantize_model(model, plan.method, dtype, plan.isa, plan.dense_dtype)
    log.info(
        "weights: %d linears quantized to %s blocks, kernels %s, activations %s%s, in %.1fs (%s)",
        n,
        plan.method,
        plan.isa or "pure torch (dequantized)",
        str(dtype).removeprefix("torch."),
        _dense_note(plan),
        time.perf_counter() - t0,
        plan.reason,
    )


def _dense_note(plan: WeightPlan) -> str:
    if plan.dense_dtype is None:
        return ""
    return (
        f"; prompt tokens, and decode batches of more than {DENSE_ABOVE_ROWS}, use a dense "
        f"{str(plan.dense_dtype).removeprefix('torch.')} copy (native bf16 GEMMs here)"
    )
