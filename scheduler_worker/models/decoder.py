"""The decoder model every family of `layers="decoder"` runs (common/families): Llama,
SmolLM2, Mistral, Qwen2 / 3, Phi-3, Granite, Gemma 3, OLMo 2, GPT-NeoX, GPT-2. Its layers are
models/layers.py's, made by the family's LayerRecipe; the checkpoint's numbers
(ModelArgs) scale the embeddings and logits, cap the logits and pick each layer's RoPE:
the windowed layers' own base (local_rope) where the family has one, else the global.

Hugging Face weight names are mapped on load; q/k/v and gate/up projections are stacked
into one matmul each (fewer, larger GEMMs per layer). When every decoder linear takes the
integer kernels and the recipe is one the C++ op knows (models/decode_plan.py), a decode
step runs its layers as one call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import torch
from torch import nn

from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.ops import TORCH_OPS, Linear, TorchOps
from scheduler_worker.models.common import (
    CausalLM,
    ModelArgs,
    head_argmax,
    load_stacked_weights,
    rope_scaling_of,
    rope_theta_of,
)
from scheduler_worker.models.decode_plan import DecodePlan, plan_decode_layers, plan_style
from scheduler_worker.models.layers import DecoderLayer, make_norm
from scheduler_worker.rope import RotaryEmbedding


def residual_stream(h: torch.Tensor, dtype: torch.dtype | None):
    """(residual, x) for the first layer from the embeddings h: h itself, or, where the op
    set keeps the stream wider than the model's dtype, zeros of that dtype with h as the
    first x, so the first norm's fused add takes h in exactly (and gives h's dtype)."""
    if dtype is None or dtype == h.dtype:
        return h, None
    return torch.zeros(h.shape, dtype=dtype, device=h.device), h


class DecoderForCausalLM(CausalLM):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.decode_plan: DecodePlan | None = None  # set by enable_decode_layers()
        self.softcap = args.logit_softcap
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        if args.recipe.learned_positions:
            self.embed_positions = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = make_norm(args, args.hidden_size)
        self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)
        windows = args.layer_windows or (None,) * args.num_layers
        own = args.local_rope is not None
        self.layer_rope = ["local" if own and w is not None else "global" for w in windows]
        self.ropes = self._make_ropes()  # cos/sin computed once per forward, for every layer
        self.post_init()

    def _make_ropes(self) -> nn.ModuleDict:
        a = self.args
        hf = a.hf_config
        theta, scaling = a.global_rope or (rope_theta_of(hf), rope_scaling_of(hf))
        # no tables where two bases would each hold one (Gemma 3's 32k context: 67 MB), nor
        # for partial rotary (the torch rotation reads cos / sin)
        table = a.local_rope is None and a.rotary_dim == a.head_dim
        ropes: dict[str, nn.Module] = {}
        if a.rotary_dim == 0:  # learned positions
            return nn.ModuleDict(ropes)
        if a.local_rope is not None:  # first: the decode op's rope pair 0
            ropes["local"] = RotaryEmbedding(
                a.rotary_dim, a.max_position_embeddings, *a.local_rope, table=False
            )
        ropes["global"] = RotaryEmbedding(
            a.rotary_dim, a.max_position_embeddings, theta, scaling, table=table
        )
        return nn.ModuleDict(ropes)

    def post_init(self) -> None:
        """Tie lm_head to the embeddings and (re)build the rope tables on the real device."""
        tied_modules = isinstance(self.lm_head, nn.Linear) and isinstance(
            self.embed_tokens, nn.Embedding
        )  # a GGUF model's are modules over the file's tensor (scheduler_worker.loader)
        if self.args.tie_word_embeddings and tied_modules:
            self.lm_head.weight = self.embed_tokens.weight
        if self.norm.weight.device.type != "meta":
            self.ropes = self._make_ropes()

    def enable_decode_layers(self) -> bool:
        """Run decode steps whose linears all take the integer kernels as one C++ call
        (torch.ops.zeroserve.decode_layers: the same ops as the modules, without the
        Python between them). Needs a recipe the op knows (plan_style), the C++ op set and
        every decoder linear a QuantLinear on one kernel path; returns whether the plan
        was made."""
        style = plan_style(self.args)
        if style is None or not self.ops.one_call_decode:
            return False

        def w(norm: nn.Module) -> torch.Tensor:  # a 1 + w gain as a plain weight
            weight = cast(torch.Tensor, norm.weight).detach()
            offset = float(getattr(norm, "weight_offset", 0.0))
            return weight if not offset else (offset + weight.float()).to(weight.dtype)

        items: list[torch.Tensor | nn.Module] = []
        for layer in cast(list[DecoderLayer], list(self.layers)):
            attn, mlp = layer.self_attn, layer.mlp
            items.append(w(layer.input_layernorm))
            if attn.qk_norm is not None:
                items += [w(attn.q_norm), w(attn.k_norm)]
            items += [attn.qkv_proj, attn.o_proj]
            if layer.post_norm:
                items.append(w(layer.post_attention_layernorm))
            items += [w(layer.mlp_norm), mlp.gate_up_proj, mlp.down_proj]
            if layer.post_norm:
                items.append(w(layer.post_feedforward_layernorm))
        scale = cast(DecoderLayer, self.layers[0]).self_attn.scale
        windows = list(self.args.layer_windows or [None] * len(self.layers))
        kinds = [list(self.ropes).index(kind) for kind in self.layer_rope]
        self.decode_plan = plan_decode_layers(items, scale, windows, kinds, style)
        return self.decode_plan is not None

    def _plan_step(self, plan: DecodePlan, h, positions, kv_caches, meta) -> torch.Tensor:
        ropes = [cast(RotaryEmbedding, r) for r in self.ropes.values()]
        if all(r.table for r in ropes):  # the op reads the tables at the positions
            rows, tables = positions, [t for r in ropes for t in r.tables_f32()]
        else:  # this step's float32 [T, rotary_dim / 2], row t token t's
            rows, tables = torch.arange(h.shape[0], device=h.device), []
            for r in ropes:
                freqs = r.freqs(positions)
                tables += [freqs.cos(), freqs.sin()]
        residual = h.contiguous()
        eps = cast(float, self.norm.eps)
        out = plan.run(self.args, residual, rows, tables, kv_caches, meta, eps)
        return self.norm(out, residual)

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.args.recipe.learned_positions:
            h = h + self.embed_positions(positions)
        if self.args.embedding_scale != 1.0:  # as transformers: the scale in the model's dtype
            h = h * torch.tensor(self.args.embedding_scale, dtype=h.dtype)
        plan = self.decode_plan
        if plan is not None and plan.takes(meta, input_ids.shape[0]):
            return self._plan_step(plan, h, positions, kv_caches, meta)
        dtype = h.dtype
        rope = {
            kind: self.ops.rope_inputs(cast(RotaryEmbedding, r), positions, dtype)
            for kind, r in self.ropes.items()
        }
        layers = cast(list[DecoderLayer], list(self.layers))
        if layers[0].fused:
            # x: the previous layer's MLP output, added into the residual by the next norm
            residual, x = residual_stream(h, self.ops.residual_dtype)
            for layer, kind, kv_cache in zip(layers, self.layer_rope, kv_caches):
                x = layer.forward_fused(rope.get(kind), x, residual, kv_cache, meta)
            return self.norm(x, residual)
        if self.ops.residual_dtype is not None:
            h = h.to(self.ops.residual_dtype)  # the residual stream (TorchOps.residual_dtype)
        for layer, kind, kv_cache in zip(layers, self.layer_rope, kv_caches):
            h = layer(rope.get(kind), h, kv_cache, meta, dtype)
        return self.norm(h, out_dtype=dtype)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.args.logit_divisor != 1.0:
            logits = logits / self.args.logit_divisor
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def greedy_tokens(self, hidden: torch.Tensor, vocab: int) -> torch.Tensor | None:
        # a positive divisor keeps the argmax; the softcap's tanh can round distinct logits
        # to one value, so no argmax of the raw ones under it
        if self.args.logit_divisor <= 0 or self.softcap is not None:
            return None
        return head_argmax(self.lm_head, hidden, vocab)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked_weights(self, weights, self.args)
