"""A step's tokens into its requests, the common row in one loop.

Most rows of a decode step are alike: running, reading no history (no grammar, penalty or
prompt logprobs), without logprobs or drafts, their token neither a stop nor their last.
For those, `resolve_rows` does Scheduler.resolve's work and builds the RequestOutput
inline: a call a row and the checks such a row cannot need were a tenth of the host's step
at 256 rows (docs/benchmarks.md, "Host step, persistent rows"). Any other row goes to
`other` (the engine: resolve, grammar, verify, last output) in its place, so the outputs
keep the step's row order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.sampling import TokenLogprobs
from scheduler_worker.scheduler import Scheduler
from scheduler_worker.step_output import RequestOutput, new_output

OtherRow = Callable[[Request, int, int, "TokenLogprobs | None"], "RequestOutput | None"]


def resolve_rows(
    scheduler: Scheduler,
    sampled: Sequence[tuple[Request, int]],
    token_ids: Sequence[int],
    logprobs: Sequence[TokenLogprobs | None],
    drafts: dict,
    other: OtherRow,
) -> list[RequestOutput]:
    """Each sampled (request, placeholder index) takes its token; the outputs of the rows
    that have one (a row that finished before its token has none), in row order."""
    outputs: list[RequestOutput] = []
    append = outputs.append
    running, bs, hash_blocks = RequestStatus.RUNNING, scheduler.block_size, scheduler._hash_blocks
    for (req, index), token, lp in zip(sampled, token_ids, logprobs):
        n_out = index + 1 - req.num_prompt_tokens
        if (
            req.status is not running
            or req.reads_history
            or lp is not None
            or token in req.stop_tokens
            or n_out >= req.max_tokens
            or req.first_token_time is None
            or drafts
            and req.request_id in drafts
        ):
            out = other(req, index, token, lp)
            if out is not None:
                append(out)
            continue
        # Scheduler.resolve's common case: the placeholder becomes the token, the blocks
        # it fills are hashed (the request neither stops nor ends here). Its tokens are
        # known up to index (placeholders resolve in order: the later ones are pending)
        req.num_pending -= 1
        tokens = req.token_ids
        tokens[index] = token
        req.output_token_ids[n_out - 1] = token
        if min(req.num_computed_tokens, index + 1) // bs > req.num_hashed_blocks:
            hash_blocks(req)
        num_prompt = req.num_prompt_tokens
        append(
            new_output(
                RequestOutput,
                (
                    req.request_id,
                    [token],
                    None,  # finish_reason
                    None,  # logprobs
                    num_prompt,
                    len(tokens) - num_prompt,  # with the step in flight's placeholder
                    req.num_cached_tokens,
                    None,  # stop_token_id
                    None,  # stage_times
                    None,  # prompt_logprobs
                ),
            )
        )
    return outputs
