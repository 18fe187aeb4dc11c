"""A step's grammar masks on a GPU in one Triton launch: -inf into each constrained row's
logits wherever its packed bitmask (llguidance's words: bit j of word w = token 32 w + j)
forbids the token, read from the words themselves, where the torch path unpacks them in
~9 ops (logits_processors.apply_token_masks); as xgrammar's and vLLM's bitmask kernels do.

    mask_rows(logits [R, V] f32 or bf16, rows [k] i64, words [k, W] i32) -> None: row
              rows[i] of `logits` written in place from words[i]; tokens past 32 W forbidden

One program a (row, tile of the vocabulary), storing only where a token is forbidden.
Under TRITON_INTERPRET=1 it runs on CPU tensors, which is how the tests check it
(tests/scheduler_worker/test_grammar_masks.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 1024  # tokens a program


@triton.jit(do_not_specialize=["stride_w", "W"])  # the words' width: the grammar tokenizer's
def _mask_rows_kernel(logits, stride_l, rows, words, stride_w, W, V, TILE: tl.constexpr):
    i = tl.program_id(0)
    offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
    word = offs // 32
    inside = offs < V
    w = tl.load(words + i * stride_w + word, mask=inside & (word < W), other=0)
    allowed = (w >> (offs % 32)) & 1  # an arithmetic shift: bit 31 too, & 1
    row = tl.load(rows + i)
    ninf = tl.full([TILE], float("-inf"), tl.float32).to(logits.dtype.element_ty)
    tl.store(logits + row * stride_l + offs, ninf, mask=inside & (allowed == 0))


def mask_rows(logits: torch.Tensor, rows: torch.Tensor, words: torch.Tensor) -> None:
    """In place: -inf in row rows[i] of `logits` at each token words[i] forbids."""
    k, num_words = words.shape
    if k == 0:
        return
    assert logits.stride(1) == 1 and words.stride(1) == 1 and words.dtype == torch.int32
    vocab = logits.shape[1]
    grid = (k, triton.cdiv(vocab, TILE))
    _mask_rows_kernel[grid](
        logits, logits.stride(0), rows, words, words.stride(0), num_words, vocab, TILE=TILE
    )


def warm_up(device: torch.device, vocab: int, dtypes: tuple[torch.dtype, ...]) -> None:
    """Compile the kernel at start for this vocabulary and each logits dtype: else a
    batch's first constrained row stalls every stream for the compile."""
    rows = torch.zeros(1, dtype=torch.long, device=device)
    words = torch.full((1, -(-vocab // 32)), -1, dtype=torch.int32, device=device)
    for dtype in dict.fromkeys(dtypes):
        mask_rows(torch.zeros(1, vocab, dtype=dtype, device=device), rows, words)
