"""The tensor-parallel layers, swapped into a model built with its rank's local sizes.

    qkv_proj, gate_up_proj   column-parallel: the rank's rows only, so they stay plain
                             nn.Linear of the local sizes (Partition.local_args); the
                             attention and the activation run on the rank's heads/columns
    o_proj, down_proj        row-parallel: the rank's input columns, one all-reduce of
                             the [tokens, hidden] output, then the bias (held whole)
    embed_tokens             vocabulary-parallel: the rank's rows, zeros for the ids it
                             does not hold, one all-reduce
    lm_head                  vocabulary-parallel: the rank's logits, gathered on rank 0
                             (cut to the vocabulary), where sampling runs; a greedy step
                             gathers each rank's best logit and its id only (argmax)

A step so runs 2 all-reduces a layer, 1 for the embeddings and one gather of the logits.
The modules keep nn.Linear / nn.Embedding as their bases, so the models' own tying
(lm_head.weight = embed_tokens.weight) and weight loading work unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scheduler_worker.models.common import ArgmaxHead
from scheduler_worker.parallel.group import TPGroup
from scheduler_worker.parallel.partition import Partition


class RowParallelLinear(nn.Linear):
    def __init__(self, local_in: int, out: int, bias: bool, group: TPGroup) -> None:
        super().__init__(local_in, out, bias=bias)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.group.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    def __init__(self, part: Partition, dim: int, group: TPGroup) -> None:
        super().__init__(part.vocab_rows, dim)
        self.start, self.stop = part.vocab
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.start) | (ids >= self.stop)
        local = (ids - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return self.group.all_reduce(out)


class ParallelLMHead(nn.Linear, ArgmaxHead):
    def __init__(self, part: Partition, dim: int, vocab: int, group: TPGroup) -> None:
        super().__init__(dim, part.vocab_rows, bias=False)
        self.vocab = vocab
        self.start, self.stop = part.vocab
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.gather_columns(F.linear(x, self.weight), self.vocab)

    def argmax(self, hidden: torch.Tensor, vocab: int) -> torch.Tensor:
        """A greedy step's tokens (rank 0's; the others' are their own rows' best): each
        rank's best logit of its rows under `vocab` and its id, [rows, 2] float64, gathered;
        the first rank holding the highest wins, so ties go to the lowest id, as one
        argmax over the whole row does. Not the [rows, vocab / T] logits."""
        logits = F.linear(hidden, self.weight)
        real = max(0, min(vocab, self.stop) - self.start)
        if real:
            best, ids = logits[:, :real].max(dim=-1)
        else:  # this rank's rows are all past `vocab`
            best = torch.full(logits.shape[:1], float("-inf"), device=logits.device)
            ids = torch.zeros(logits.shape[:1], dtype=torch.long, device=logits.device)
        pair = torch.stack([best.double(), (ids + self.start).double()], dim=1)
        parts = self.group.gather(pair)
        if parts is None:
            return ids + self.start
        every = torch.stack(parts)  # [ranks, rows, 2]
        winner = every[:, :, 0].argmax(dim=0)
        return every[winner, torch.arange(every.shape[1]), 1].long()


def shard_modules(model: nn.Module, part: Partition, group: TPGroup) -> None:
    """Swap the model's row-parallel and vocabulary modules for their parallel forms (on
    the meta device, before the weights load). The model was built with the local sizes."""
    for mod in list(model.modules()):
        for child_name in ("o_proj", "down_proj"):
            child = getattr(mod, child_name, None)
            if isinstance(child, nn.Linear) and not isinstance(child, RowParallelLinear):
                swapped = RowParallelLinear(
                    child.in_features, child.out_features, child.bias is not None, group
                )
                setattr(mod, child_name, swapped)
    embed = getattr(model, "embed_tokens", None)
    head = getattr(model, "lm_head", None)
    if not isinstance(embed, nn.Embedding) or not isinstance(head, nn.Linear):
        raise TypeError(f"{type(model).__name__}: no embed_tokens / lm_head to shard")
    model.embed_tokens = VocabParallelEmbedding(part, embed.embedding_dim, group)
    model.lm_head = ParallelLMHead(part, head.in_features, head.out_features, group)
