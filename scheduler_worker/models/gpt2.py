"""GPT-2 in plain torch: learned positions, LayerNorm, fused c_attn, tied lm_head.

HF GPT-2 stores its projections as Conv1D ([in, out]); they are transposed on load.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from scheduler_worker.activations import ACTIVATIONS
from scheduler_worker.attention import AttentionMetadata
from scheduler_worker.backends.ops import TORCH_OPS, TorchOps
from scheduler_worker.models.common import CausalLM, ModelArgs, WeightLoader

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_IGNORED = ({"attn", "bias"}, {"attn", "masked_bias"})  # causal-mask buffers in old checkpoints


class GPT2Block(nn.Module):
    ops: TorchOps = TORCH_OPS  # the device backend's op set (ModelRunner sets it)

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h = args.hidden_size
        self.num_heads, self.head_dim = args.num_heads, args.head_dim
        self.ln_1 = nn.LayerNorm(h, eps=args.norm_eps)
        self.c_attn = nn.Linear(h, 3 * h)
        self.attn_proj = nn.Linear(h, h)
        self.ln_2 = nn.LayerNorm(h, eps=args.norm_eps)
        self.c_fc = nn.Linear(h, args.intermediate_size)
        self.mlp_proj = nn.Linear(args.intermediate_size, h)
        self.act = ACTIVATIONS[args.hidden_act]
        self.scale = self.head_dim**-0.5

    def forward(self, x, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, dim=-1)
        shape = (-1, self.num_heads, self.head_dim)
        q, k, v = q.reshape(shape), k.reshape(shape), v.reshape(shape)
        self.ops.write_kv(k, v, kv_cache, meta)
        o = self.ops.attention(q, k, v, kv_cache, meta, self.scale)
        x = x + self.attn_proj(o.reshape(x.shape))
        return x + self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))


class GPT2LMHeadModel(CausalLM):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.wte = nn.Embedding(args.vocab_size, args.hidden_size)
        self.wpe = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.h = nn.ModuleList(GPT2Block(args) for _ in range(args.num_layers))
        self.ln_f = nn.LayerNorm(args.hidden_size, eps=args.norm_eps)
        # tied to wte (post_init); a Linear so that weight quantization treats the output
        # projection as it does every model's (int8 under int4, as Llama's lm_head)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.post_init()

    def post_init(self) -> None:
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        x = self.wte(input_ids) + self.wpe(positions)
        for block, kv_cache in zip(self.h, kv_caches):
            x = block(x, kv_cache, meta)
        return self.ln_f(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        loader = WeightLoader(self)
        for name, tensor in weights:
            name = name.removeprefix("transformer.")
            if name.startswith("lm_head.") or set(name.split(".")[-2:]) in _IGNORED:
                continue  # lm_head is tied to wte
            if name.endswith(_CONV1D):
                tensor = tensor.t()
            name = name.replace("attn.c_proj", "attn_proj").replace("mlp.c_proj", "mlp_proj")
            name = name.replace("mlp.c_fc", "c_fc").replace("attn.c_attn", "c_attn")
            loader.load(name, tensor)
        loader.finish()
