"""Random weights for `--load-format dummy`: a model's real shapes with no weight files.

Made in place on the parameters' own device and dtype (a GPU's bf16 weights are never a CPU
float copy), from a seeded generator of that device, so every replica gets the same model.
Scaled to stay finite through any depth in bf16 / fp16 / fp32:

    matrices, embeddings   normal(0, 1 / sqrt(in_features)): unit-variance outputs from
                           unit-variance inputs; the logits' spread ~1 (not a flat argmax)
    norms                  the identity gain (1, or 0 where the norm computes x * (1 + w))
    biases                 0
"""

from __future__ import annotations

import torch
from torch import nn

SEED = 0


@torch.no_grad()
def fill_random(model: nn.Module, seed: int = SEED) -> int:
    """Fill every parameter of `model` (already allocated on its device) as above; returns
    the number of elements filled (a tied parameter once)."""
    generators: dict[torch.device, torch.Generator] = {}
    seen: set[int] = set()
    filled = 0
    for mod in model.modules():
        for name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if p.dim() >= 2:
                if p.device not in generators:
                    generators[p.device] = torch.Generator(device=p.device).manual_seed(seed)
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=generators[p.device])
            elif name == "bias":
                p.zero_()
            else:  # a norm's gain, as its module reads it (GemmaRMSNorm: 1 + w)
                p.fill_(1.0 - float(getattr(mod, "weight_offset", 0.0)))
            filled += p.numel()
    return filled
