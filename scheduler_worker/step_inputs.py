"""A scheduled batch's requests -> the step's inputs for the backend.

    decode-only step    DecodeRows: a column each (tokens, positions, table rows, rows of
                        the step in flight), a list comprehension each; the
                        tables are the scheduler's own (BlockTables), not copied
    prompt chunks       a SeqInput a row (its chunk's tokens, its table, prompt logits)
    or drafts           (a drafted row: [its last token, drafts...], logits at every one)

A placeholder token (overlapped scheduling) is -1, with its row in the step in flight.
"""

from __future__ import annotations

from scheduler_worker.backends.base import DecodeRows, SeqInput
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.request import PLACEHOLDER, Request


def decode_rows(reqs: list[Request], tables: BlockTables) -> DecodeRows:
    """A decode-only step's inputs (every row samples its next token). A row with a
    placeholder computes it (its last token, -1): overlapped, most rows of most steps."""
    # list comprehensions: attrgetter passes (map) took ~1.7x their time
    positions = [req.num_computed_tokens for req in reqs]
    prev_rows = [req.flight_row if req.num_pending else -1 for req in reqs]
    tokens, known = [PLACEHOLDER] * len(reqs), 0
    if -1 in prev_rows:  # some tokens known (a row with no token in flight): read
        at = [i for i, row in enumerate(prev_rows) if row < 0]
        for i in at:
            tokens[i] = reqs[i].token_ids[positions[i]]
        known = len(at)
    slots = [req.slot for req in reqs]
    return DecodeRows(tokens, positions, slots, prev_rows, tables, known)


def seq_inputs(
    entries: list[tuple[Request, int]],
    sampling: list[bool],
    drafts: dict[str, list[int]] | None = None,
) -> list[SeqInput]:
    """A step with prompt chunks or drafts: a SeqInput a (request, tokens to compute)
    entry. A drafted row computes its last token then its drafts, with the logits of
    each (the leading ones as `prompt_logits`): the engine verifies them."""
    return [
        SeqInput(
            req.token_ids[req.num_computed_tokens : req.num_computed_tokens + n],
            req.num_computed_tokens,
            req.block_table,
            sample,
            _prompt_logits(req, n) if req.reads_history else 0,
            req.flight_row if req.num_pending else -1,
            req.slot,
        )
        if not drafts or req.request_id not in drafts
        else _drafted(req, drafts[req.request_id])
        for (req, n), sample in zip(entries, sampling)
    ]


def _drafted(req: Request, drafts: list[int]) -> SeqInput:
    start = req.num_computed_tokens  # its last token (known: a drafting row has no placeholder)
    tokens = [req.token_ids[start], *drafts]
    # a plain greedy row verifies by argmax; the others need the logits (to sample, or
    # to mask with a grammar)
    return SeqInput(
        tokens, start, req.block_table, True, len(drafts), -1, req.slot, req.plain, True
    )


def _prompt_logits(req: Request, n: int) -> int:
    """How many of the chunk's n tokens need logits for prompt logprobs: those before
    the prompt's last token (each scores the next prompt token)."""
    if not req.wants_prompt_logprobs:
        return 0
    return max(
        0, min(req.num_computed_tokens + n, req.num_prompt_tokens - 1) - req.num_computed_tokens
    )
