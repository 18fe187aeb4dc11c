"""The decode kernel's context splits where the graphs run them: one launch with a cap of
splits (as a graph captures it) and each row taking as many as its own context has key
tiles, read on the device; against the torch reference attention (attention.py).

Shapes are the real tile's (128 keys a tile at head_dim <= 128): 2 and 16 non-empty
splits, up to 64 rows, in the interpreter without a GPU (a few seconds in all).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from scheduler_worker.attention import AttentionMetadata, paged_attention  # noqa: E402
from scheduler_worker.backends.triton_decode import (  # noqa: E402
    decode_workspace,
    paged_decode_attention,
)

DEVICE = (
    "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
)
BLOCK_SIZE = 16


def paged_cache(
    context_lens: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random K/V over shuffled blocks and block tables [B, W] (past a row's blocks: a
    block of other data, which no key may read)."""
    gen = torch.Generator().manual_seed(seed)
    need = [max(1, -(-n // BLOCK_SIZE)) for n in context_lens]
    num_blocks = sum(need) + 1
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(need), max(need)), int(perm[-1]), dtype=torch.int64)
    used = 0
    for r, n in enumerate(need):
        tables[r, :n] = perm[used : used + n]
        used += n
    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k.to(DEVICE), v.to(DEVICE), tables.to(DEVICE)


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    context_lens: list[int],
    scale: float,
    window: int,
) -> torch.Tensor:
    """attention.py's decode path (SDPA over the gathered blocks), in float32."""
    width = tables.shape[1] * BLOCK_SIZE
    ctx = torch.tensor(context_lens, device=q.device)
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long, device=q.device),
        num_decode=q.shape[0],
        decode_block_tables=tables,
        decode_context_lens=ctx,
        decode_mask=(torch.arange(width, device=q.device) < ctx[:, None])[:, None, None, :],
    )
    k32, v32 = k_cache.float(), v_cache.float()
    return paged_attention(
        q.float(), k32[:0, 0], v32[:0, 0], k32, v32, meta, scale, kv_written=True,
        window=window or None,
    )  # fmt: skip


def run(
    context_lens: list[int],
    num_splits: int,
    head_dim: int,
    dtype: torch.dtype,
    window: int = 0,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """The kernel at a cap of num_splits over NaN-filled partials: (its output, the
    reference's, the partials afterwards)."""
    num_heads, num_kv_heads = 4, 1  # 4 query heads a KV head, as Llama-3.2-1B
    k_cache, v_cache, tables = paged_cache(context_lens, num_kv_heads, head_dim, dtype, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(len(context_lens), num_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    ws = decode_workspace(len(context_lens), num_heads, num_splits, head_dim, q.device)
    for t in ws:
        t.fill_(float("nan"))  # a partial the merge reads but no split wrote: NaN out
    got = paged_decode_attention(
        q, k_cache, v_cache, tables.int(),
        torch.tensor(context_lens, dtype=torch.int32, device=DEVICE), scale, window,
        num_splits=num_splits, workspace=ws,
    )  # fmt: skip
    want = reference(q, k_cache, v_cache, tables, context_lens, scale, window)
    return got, want, ws


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def splits_written(part_l: torch.Tensor) -> list[int]:
    """Per row, the splits whose partials were written (every head alike)."""
    written = ~part_l.isnan()  # [B, H, S]
    assert bool((written == written[:, :1]).all()), "heads of a row split alike"
    return written[:, 0].sum(-1).tolist()


@pytest.mark.parametrize(
    ("head_dim", "dtype", "window", "want_splits"),
    [
        # 128-key tiles: 2000 and 1921 keys 16 tiles, 200 and 129 two, 128 and 5 one
        (64, torch.float32, 0, [16, 16, 2, 2, 1, 1]),
        (128, torch.bfloat16, 0, [16, 16, 2, 2, 1, 1]),
        # the last 700 keys: from tile 10 of 2000 (6 tiles), from tile 9 of 1921 (7);
        # the shorter rows lie within the window and split as before
        (64, torch.float32, 700, [6, 7, 2, 2, 1, 1]),
    ],
)
def test_one_launch_at_16_splits_gives_each_row_its_own_count(
    head_dim: int, dtype: torch.dtype, window: int, want_splits: list[int]
) -> None:
    """A 16-split launch, as the 1-row graph captures it: rows of long contexts use 16
    splits, rows of short ones only the splits their keys fill (a row of one tile writes
    its output whole and no partial), and the merge reads only the splits written."""
    context_lens = [2000, 1921, 200, 129, 128, 5]
    got, want, (part_m, part_l, _) = run(context_lens, 16, head_dim, dtype, window)
    used = [n if n > 1 else 0 for n in want_splits]  # one split: no partials
    assert splits_written(part_l) == used
    assert splits_written(part_m) == used
    assert not got.isnan().any()
    torch.testing.assert_close(got.float(), want, **tol(dtype))


@pytest.mark.parametrize(
    ("num_rows", "head_dim", "dtype"), [(64, 64, torch.float32), (32, 128, torch.bfloat16)]
)
def test_many_rows_under_a_cap_of_4(num_rows: int, head_dim: int, dtype: torch.dtype) -> None:
    """Up to 64 rows at a cap of 4 splits, contexts from 1 to 512 keys: 1 to 4 splits a
    row (as many as its key tiles), in one launch."""
    context_lens = [1 + (37 * r) % 512 for r in range(num_rows)]
    got, want, (_, part_l, _) = run(context_lens, 4, head_dim, dtype, seed=7)
    tiles = [-(-n // 128) for n in context_lens]
    assert set(tiles) == {1, 2, 3, 4}
    assert splits_written(part_l) == [t if t > 1 else 0 for t in tiles]
    torch.testing.assert_close(got.float(), want, **tol(dtype))


def test_the_same_launch_follows_each_steps_contexts() -> None:
    """A captured graph's launch: the same tensors, the contexts rewritten in place between
    steps (as StaticDecodeInputs.fill does). Each step splits by its own contexts."""
    num_heads, num_kv_heads, head_dim = 4, 1, 64
    k_cache, v_cache, tables = paged_cache([2048, 2048], num_kv_heads, head_dim, torch.float32, 3)
    q = torch.randn(2, num_heads, head_dim, generator=torch.Generator().manual_seed(4))
    q = q.to(DEVICE)
    ctx = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    out = torch.empty_like(q)
    ws = decode_workspace(2, num_heads, 16, head_dim, q.device)
    for step in ([2048, 300], [100, 1500], [257, 256]):
        for t in ws:
            t.fill_(float("nan"))
        ctx.copy_(torch.tensor(step))
        paged_decode_attention(
            q, k_cache, v_cache, tables, ctx, head_dim**-0.5, out=out, num_splits=16,
            workspace=ws,
        )  # fmt: skip
        tiles = [-(-n // 128) for n in step]
        assert splits_written(ws[1]) == [t if t > 1 else 0 for t in tiles]
        want = reference(q, k_cache, v_cache, tables, step, head_dim**-0.5, 0)
        torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
