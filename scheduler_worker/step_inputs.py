"""A scheduled batch's requests -> the step's inputs for the backend.

    decode-only step    DecodeRows: a column each (tokens, positions, table rows, rows of
                        the step in flight), a few C-level passes over the rows; the
                        tables are the scheduler's own (BlockTables), not copied
    prompt chunks       a SeqInput a row (its chunk's tokens, its table, prompt logits)
    or drafts           (a drafted row: [its last token, drafts...], logits at every one)

A placeholder token (overlapped scheduling) is -1, with its row in the step in flight.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from scheduler_worker.backends.base import DecodeRows, SeqInput
from scheduler_worker.backends.block_tables import BlockTables
from scheduler_worker.request import PLACEHOLDER, Request

_SLOT = attrgetter("slot")
_COMPUTED = attrgetter("num_computed_tokens")
_PENDING, _FLIGHT_ROW = attrgetter("num_pending"), attrgetter("flight_row")


def decode_rows(reqs: list[Request], tables: BlockTables) -> DecodeRows:
    """A decode-only step's inputs (every row samples its next token). A row with a
    placeholder computes it (its last token, -1): overlapped, most rows of most steps."""
    positions = list(map(_COMPUTED, reqs))
    tokens = [PLACEHOLDER] * len(reqs)
    if all(map(_PENDING, reqs)):  # every row's token in flight: the usual step
        prev_rows = list(map(_FLIGHT_ROW, reqs))
    else:  # some tokens known (a grammar row back from sitting out): only those read
        flight = np.fromiter(map(_FLIGHT_ROW, reqs), dtype=np.int64, count=len(reqs))
        pending = np.fromiter(map(_PENDING, reqs), dtype=np.int64, count=len(reqs))
        prev = np.where(pending > 0, flight, -1)
        prev_rows = prev.tolist()
        for i in np.flatnonzero(prev < 0).tolist():
            tokens[i] = reqs[i].token_ids[positions[i]]
    return DecodeRows(tokens, positions, list(map(_SLOT, reqs)), prev_rows, tables)


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
