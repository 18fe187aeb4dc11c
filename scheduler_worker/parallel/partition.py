"""Which part of the model a tensor-parallel rank holds: head, MLP and vocabulary ranges.

    query heads   by KV group: rank r holds whole groups (G = heads / kv_heads query heads
                  each), as evenly as they go (3 groups over 2 ranks: 2 and 1, so the
                  ranks' loads differ but each rank's heads keep the model's grouping)
                  fewer KV heads than ranks: each KV head is held by world / kv_heads
                  ranks (replicated), each taking an equal share of its group's queries
    MLP           intermediate columns, as evenly as they go
    vocabulary    ceil(vocab / world) rows a rank, the last rank's padded with zero rows
                  (their logits are cut off after the gather)

A rank's model is the model built with its local sizes (`local_args`): the attention, the
KV cache and the op sets see only the rank's heads; the hidden size is the model's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from common.config import ConfigError
from common.families import BY_ARCHITECTURE
from scheduler_worker.models.common import ModelArgs


def _even(total: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part `index` of `total` split in `parts` as evenly as it goes."""
    base, extra = divmod(total, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@dataclass(frozen=True)
class Partition:
    rank: int
    world: int
    q_heads: tuple[int, int]  # [start, stop) of the model's query heads
    kv_heads: tuple[int, int]  # [start, stop) of its KV heads
    inter: tuple[int, int]  # [start, stop) of the MLP's intermediate columns
    vocab: tuple[int, int]  # [start, stop) of the vocabulary's real rows
    vocab_rows: int  # rows a rank holds (the last one's padded past stop)
    head_dim: int

    @property
    def num_heads(self) -> int:
        return self.q_heads[1] - self.q_heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]

    def local_args(self, args: ModelArgs) -> ModelArgs:
        """The shapes this rank's modules are built with (vocab_size stays the model's)."""
        return replace(
            args,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            intermediate_size=self.inter[1] - self.inter[0],
        )

    def rows(self, piece: str) -> tuple[int, int]:
        """[start, stop) along a projection's output rows (q, k, v, gate, up) or along
        o_proj / down_proj's input columns (o, down)."""
        d = self.head_dim
        if piece in ("q", "o"):
            return self.q_heads[0] * d, self.q_heads[1] * d
        if piece in ("k", "v"):
            return self.kv_heads[0] * d, self.kv_heads[1] * d
        return self.inter  # gate, up, down


def plan_partition(args: ModelArgs, rank: int, world: int) -> Partition:
    """Rank `rank`'s part of the model, or a one-line ConfigError naming what does not
    split over `world` ranks."""
    family = BY_ARCHITECTURE[args.architecture]
    tp = f"--tensor-parallel-size {world}"
    if args.recipe.qk_norm == "full":
        raise ConfigError(f"{tp}: {args.architecture}'s QK-norm over all heads is not sharded yet")
    if family.weights is not None:
        raise ConfigError(f"{tp}: {args.architecture}'s checkpoint layout is not sharded yet")
    heads, kv = args.num_heads, args.num_kv_heads
    group = heads // kv
    if kv >= world:
        kv_range = _even(kv, world, rank)
        q_range = (kv_range[0] * group, kv_range[1] * group)
    else:
        share = world // kv  # ranks per KV head
        if world % kv or group % share:
            raise ConfigError(
                f"{tp}: {kv} KV head(s) over {world} ranks need the ranks to be a multiple "
                f"of the KV heads and each KV head's {group} query heads to split evenly "
                f"over its {world // kv or 1} ranks"
            )
        head, part = divmod(rank, share)
        per = group // share
        kv_range = (head, head + 1)
        q_range = (head * group + part * per, head * group + (part + 1) * per)
    if args.intermediate_size < world:
        raise ConfigError(f"{tp}: intermediate size {args.intermediate_size} is under {world}")
    vocab_rows = -(-args.vocab_size // world)
    start = min(rank * vocab_rows, args.vocab_size)
    return Partition(
        rank=rank,
        world=world,
        q_heads=q_range,
        kv_heads=kv_range,
        inter=_even(args.intermediate_size, world, rank),
        vocab=(start, min(start + vocab_rows, args.vocab_size)),
        vocab_rows=vocab_rows,
        head_dim=args.head_dim,
    )
