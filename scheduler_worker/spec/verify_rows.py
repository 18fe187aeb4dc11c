"""A step with drafted rows run as decode rows (the CPU's verify, issue 53 item 6).

A drafted row computes [its last token, d1..dk] from position L with logits at each. Run
as a prompt chunk it takes the prompt path's kernels, which round unlike the one-token
decode step (so drafts could change greedy output at a near-tie) and cost more. Here it
becomes 1 + k decode rows of its block table instead:

    drafted row   [ last | d1 | d2 ]  at L          one SeqInput, prompt_logits 2
    as rows       [ last ] at L  |  [ d1 ] at L+1  |  [ d2 ] at L+2     (each sampled)

Row j attends context L+1+j. Per layer the decode step writes every row's K/V into the
cache before any row attends (rope_write_kv, then paged_decode_attention:
kernels/csrc/decode_model.cpp and the module path alike), and the integer GEMMs quantize
and reduce each row alone, so row j's logits are bit for bit those of a plain decode step
at position L+j, and a step of plain and drafted rows is one decode_layers call.
Backend.verify_as_decode_rows says where this holds (the CPU's paged kernel).
"""

from __future__ import annotations

from scheduler_worker.backends.base import SeqInput, step_order


def expand(seqs: list[SeqInput]) -> list[SeqInput]:
    """The step's inputs with every `verify` row as its 1 + k one-token rows, in place."""
    out: list[SeqInput] = []
    for s in seqs:
        if not s.verify:
            out.append(s)
            continue
        start, table = s.num_computed, s.block_table
        out += [SeqInput([t], start + j, table, slot=s.slot) for j, t in enumerate(s.token_ids)]
    return out


def token_offsets(seqs: list[SeqInput]) -> list[int]:
    """Each sequence's first token in the step's flat tokens (decodes first: step_order)."""
    offsets = [0] * len(seqs)
    at = 0
    for i in step_order(seqs):
        offsets[i] = at
        at += len(seqs[i].token_ids)
    return offsets


def placement(seqs: list[SeqInput]) -> list[tuple[int, int, int]]:
    """Per sequence of the unexpanded step: (its first row in expand(seqs), its first row
    among the expanded step's sampled rows, how many it has there: 1 + k for a verify
    row, 1 for a sampled one, 0 for a mid-prompt chunk)."""
    out: list[tuple[int, int, int]] = []
    row = sampled = 0
    for s in seqs:
        n = len(s.token_ids) if s.verify else int(s.sample)
        out.append((row, sampled, n))
        row += len(s.token_ids) if s.verify else 1
        sampled += n
    return out
