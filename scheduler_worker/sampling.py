"""Sampling for the whole batch at once.

Logit processing, each step vectorized over the rows that need it (the steps before the
sample are scheduler_worker.logits_processors):

    raw logits ─┬─▶ grammar mask (constrained rows) ─▶ min_tokens mask (EOS + stop ids)
                │   ─▶ logit_bias (added; -inf stays -inf: the grammar wins)
                │   ─▶ repetition penalty (prompt+output, HF)
                │   ─▶ presence/frequency penalties (output, OpenAI) ─┬─▶ argmax (greedy rows)
                │                                                     │
                │   ┌─────────────────────────────────────────────────┘ (other rows)
                │   └─▶ / temperature ─▶ top-k ─▶ softmax ─▶ top-p ─▶ min-p
                │       ─▶ exponential race: a block of 256 tokens, then a token in it
                └─▶ log_softmax ─▶ logprobs (sampled token + top-N)
                                      │
        DeviceSample (device tensors) ┴─▶ start_copy() ─▶ pinned host ─▶ result(): lists

A batch of plain greedy rows (no penalties, logit_bias, logprobs, grammar or min_tokens still
blocking) takes one argmax; without grammar masks the engine asks the model for it first
(ModelRunner.execute): a quantized head that takes it never writes the logits. Logprobs are the model's
own, before the grammar mask (as before logit_bias, penalties and temperature; vLLM's
default `raw_logprobs` too): a token the grammar forbids keeps its logprob in the top-N. Temperatures below GREEDY_EPS (batch_params.py) count as greedy.

No host sync on a GPU: `Sampler.sample` only enqueues work and returns a DeviceSample (its
`start_copy` copies the tokens into pinned memory behind an event, `result()` waits for
that event alone), so the engine can launch the next step first. Host lists reach the
device through pinned memory, non-blocking (`backends.device.to_device`); rows move by
index_select / index_copy_ / index_fill_, never a bool mask; nothing branches on the
data: top-p by a radix search of the threshold (scheduler_worker.top_p, no sort of the
vocabulary) and the +inf/NaN repair on every row, where a CPU (`enqueues_work`) tries a
window of the most likely tokens first and repairs only the rows that need it, for the
same tokens. A top-k row's top-p cut comes from its top-k candidates alone.

Drawing (`sample_from`): an exponential race (argmax p / q, q ~ Exp(1)) among blocks of
SAMPLE_BLOCK tokens by their sums, then among the tokens of the block that won: the
tokens come out with probability p / sum(p), from ~450 random numbers per row where a
race over the whole vocabulary draws a random number and a log per token (~10 ms of a
~35 ms step at 32 rows on 2 cores, against ~1 ms). A race keeps what the one over the
vocabulary had: a logit that moves by an ulp changes the winner only at a near-tie (an
inverse CDF would add the rounding up over the vocabulary). Seeds: a seeded row's uniforms
are a hash of (seed, its token's index, column) (`seeded_uniforms`, one computation for
every seeded row of the step), so its samples do not depend on what else is in the batch;
unseeded rows share the default generator. Where the backend has a draw op (on the CPU
kernels, `Sampler.kernel_isa`: one C++ op a row; on a GPU, `draw_rows`: one Triton launch,
backends/triton_sample.py) the steps from temperature to the race run in it, the argmax rows
beside them (draws.kernel_sample: the same uniforms, the same tokens but at near-ties).
Top-k and top-p cut by value: tokens tied with the last one kept are kept too; top-p sums
the mass above a token in float64 (the same cut on every device).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import torch

from common.sampling_params import SamplingParams
from scheduler_worker.backends.base import DrawRows, MaskRows, PenalizeRows
from scheduler_worker.backends.device import HostCopy, enqueues_work, runs_cpu_kernels
from scheduler_worker.batch_params import (
    MIN_P,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    BatchParamsCache,
    plain_greedy_params,
    values_of,
)
from scheduler_worker.draws import (
    KeyPool,
    cpu_draw_rows,
    draw_uniforms,
    kernel_logprobs,
    kernel_sample,
)
from scheduler_worker.logits_processors import (
    DeviceColumns,
    Rows,
    _column,
    apply_logit_bias,
    apply_token_masks,
    mask_stop_tokens,
)
from scheduler_worker.logits_processors import SamplingRow as SamplingRow
from scheduler_worker.penalties import apply_penalties, penalty_op
from scheduler_worker.seeded_uniforms import seeded_uniforms as seeded_uniforms
from scheduler_worker.step_logprobs import RowLogprobs, StepLogprobs, TokenLogprobs
from scheduler_worker.top_p import top_p_thresholds

SAMPLE_BLOCK = 256  # tokens per block of the two-level race (sample_from)
_INF = float("inf")


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | RowLogprobs | None]


@dataclass
class DeviceSample:
    """A step's sample on the logits' device: token_ids [n] int64; for the k rows
    `logprob_rows` that asked for logprobs, the sampled token's logprob [k] float32 and the
    top-N ids [k, N] int64 / logprobs [k, N] float32 (None if N = max(num_top) is 0)."""

    token_ids: torch.Tensor
    logprob_rows: list[int] = field(default_factory=list)
    num_top: list[int] = field(default_factory=list)
    sampled_logprobs: torch.Tensor | None = None
    top_ids: torch.Tensor | None = None
    top_logprobs: torch.Tensor | None = None
    _host: HostCopy | None = field(default=None, init=False, repr=False)

    def start_copy(self) -> DeviceSample:
        """Enqueue the copies to the host (backends/device.py, HostCopy): no wait.
        Idempotent."""
        if self._host is None:
            tensors = [self.token_ids, self.sampled_logprobs, self.top_ids, self.top_logprobs]
            self._host = HostCopy(tensors)
        return self

    def result(self, kept: bool = False) -> SamplerOutput:
        """The host lists, once the copies are done (start_copy first if not yet). `kept`:
        a logprobs row's entry is a RowLogprobs into the step's arrays (step_logprobs.py),
        not its TokenLogprobs."""
        host = self.start_copy()._host
        assert host is not None
        t, s, i, p = host.wait()
        assert t is not None
        tokens, rows = t.tolist(), self.logprob_rows
        out: list = [None] * len(tokens)
        if rows:
            assert s is not None
            ids, lps = (None if x is None else x.numpy() for x in (i, p))
            block = StepLogprobs(tokens, rows, s.numpy(), ids, lps, self.num_top)
            refs = map(_new_row, repeat(RowLogprobs), zip(repeat(block), range(len(rows))))
            deque(map(out.__setitem__, rows, refs if kept else map(block.row, range(len(rows)))), 0)
        return SamplerOutput(tokens, out)


_new_row = tuple.__new__  # _new_row(RowLogprobs, (block, i))


def sampling_probs(
    logits: torch.Tensor,
    params: list[SamplingParams] | np.ndarray,
    cols: DeviceColumns | None = None,
) -> torch.Tensor:
    """Temperature, top-k (on logits), top-p and min-p (on the probabilities that top-k
    left): unnormalized probabilities with the filtered tokens at 0. params: the rows'
    parameters, or their numbers (batch_params.values_of: the sampler's, gathered by slot);
    cols: the sampler's columns kept on the device, or None."""
    dev, vocab = logits.device, logits.shape[1]
    values = values_of(params) if isinstance(params, list) else params
    temps, f32 = values[:, TEMPERATURE], torch.float32
    if (temps != 1.0).any():
        logits = logits / _column(cols, "temperature", temps, dev, f32)[:, None]
    ks = values[:, TOP_K].astype(np.int64)
    ks[(ks <= 0) | (ks >= vocab)] = 0
    candidates = None  # each row's max(ks) largest logits' ids: a top-k row's top-p window
    if ks.any():
        k = _column(cols, "top_k", np.maximum(ks, 1), dev, torch.long)[:, None]
        top = logits.topk(int(ks.max()), dim=-1)
        kth = top.values.gather(1, k - 1)
        off = _column(cols, "top_k.off", ks == 0, dev, torch.bool)
        kth.masked_fill_(off[:, None], float("-inf"))
        logits = logits.masked_fill(logits < kth, float("-inf"))
        candidates = top.indices
    # an extreme penalty or temperature can push logits to +inf (a repetition_penalty of
    # 1e-38 divides them by it), and a +inf or NaN logit makes its whole row NaN: such
    # rows again with the largest finite value for +inf. On a CPU only the rows that need
    # it (one pass over the rest is saved); on a GPU every row (no branch on the data)
    if enqueues_work(dev):
        logits = _finite(logits)  # the same on rows without +inf/NaN
    probs = logits.softmax(dim=-1)
    if not enqueues_work(dev):
        bad = probs[:, 0].isnan()
        if bool(bad.any()):
            probs[bad] = _finite(logits[bad]).softmax(dim=-1)
    # the smallest probability each row keeps
    top_ps, min_ps = values[:, TOP_P], values[:, MIN_P]
    thresh = top_p_thresholds(probs, top_ps, ks, candidates, not enqueues_work(dev), cols)
    cut_min_p = bool((min_ps > 0.0).any())
    if cut_min_p:
        min_p = _column(cols, "min_p", min_ps, dev, f32)[:, None]
        thresh = torch.maximum(thresh, probs.amax(dim=-1, keepdim=True) * min_p)
    if cut_min_p or (top_ps < 1.0).any():
        probs.masked_fill_(probs < thresh, 0.0)
    return probs


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of probs [B, V] (non-negative, unnormalized, each row with some
    mass), token t with probability probs[t] / sum(probs), from `num_uniforms(V)` uniforms
    per row u [B, n] in [0, 1): an exponential race (argmax p / q, q = -log u ~ Exp(1))
    among the blocks of SAMPLE_BLOCK tokens by their sums, then one among the tokens of the
    block that won: P(block) P(token | block) = p / sum(p). A race, unlike an inverse CDF,
    does not add up rounding over the vocabulary, so a logit that moves by an ulp (another
    batch, a prefix-cache hit) changes a seeded sample only at a near-tie."""
    rows, vocab = probs.shape
    pad = -vocab % SAMPLE_BLOCK
    if pad:
        probs = torch.nn.functional.pad(probs, (0, pad))
    blocks = probs.view(rows, -1, SAMPLE_BLOCK)
    nb = blocks.shape[1]
    sums = blocks.sum(-1)
    b = _race(sums, u[:, :nb])
    inside = blocks[torch.arange(rows, device=probs.device), b]
    return b * SAMPLE_BLOCK + _race(inside, u[:, nb : nb + SAMPLE_BLOCK])


def num_uniforms(vocab: int) -> int:
    """The uniforms sample_from takes per row: one per block, one per token of a block."""
    return -(-vocab // SAMPLE_BLOCK) + SAMPLE_BLOCK


def _race(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """argmax p / q, q = -log(u) ~ Exp(1), as argmin p / log(u): a u of 0 cannot win, nor a
    p of 0 (its 0 / 0 at a u of 1.0, which the seeded hash can give, taken as +inf)."""
    return (p / u.log()).nan_to_num_(nan=_INF, posinf=_INF, neginf=-_INF).argmin(dim=-1)


def _finite(logits: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(logits, nan=float("-inf"), posinf=torch.finfo(logits.dtype).max)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (its first index, ties, infinities and NaN alike) by `max(dim=-1)`:
    torch's CPU argmax is a scalar loop, several times slower (benchmarks.md, "Ninth round")."""
    return logits.max(dim=-1).indices


class Sampler:
    def __init__(
        self,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        kernel_isa: int | None = None,
        draw_rows: DrawRows | None = None,
        penalize_rows: PenalizeRows | None = None,
        mask_rows: MaskRows | None = None,
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.kernel_isa = kernel_isa  # the C++ kernels' path (grammar masks); None: torch
        self.draw_rows = draw_rows  # the backend's draw op (a GPU's); None: see draw_op
        self.penalize_rows = penalize_rows  # its penalties' op, likewise (penalty_op)
        self.mask_rows = mask_rows  # its grammar masks' op, likewise (apply_token_masks)
        self.batch = BatchParamsCache()  # the rows' parameters, kept between steps
        self.columns = DeviceColumns()  # their columns on the device, kept as they hold
        self.keys = KeyPool()  # a keyed draw op's unseeded keys

    def __call__(self, logits: torch.Tensor, rows: Rows, writable: bool = False) -> SamplerOutput:
        """One token per row, on the host: `sample(...).result()`."""
        return self.sample(logits, rows, writable).result()

    def sample(
        self,
        logits: torch.Tensor,
        rows: Rows,
        writable: bool = False,
        prev_tokens: torch.Tensor | None = None,
        masked: Sequence[int] | None = None,
    ) -> DeviceSample:
        """One token per row, left on the logits' device: on a GPU this only enqueues work
        (no host sync). `writable`: the caller hands `logits` over (the engine, a step's
        own): grammar masks and penalties go into them in place, the rows that ask for
        logprobs (the raw logits') copied apart first. `prev_tokens`: the step in flight's tokens, where a row's
        last output is still one of them (SampledRow.pending_row). `masked`: the rows that
        may carry a grammar mask, where the caller knows them (else every row is looked at)."""
        assert logits.shape[0] == len(rows), f"{logits.shape[0]} logit rows for {len(rows)} rows"
        logits = logits[:, : self.vocab_size]  # drop padded vocab columns, if any
        batch, cols = self.batch.of_rows(rows), self.columns
        if self.argmax_only(rows):
            cut = apply_token_masks(logits, rows, self.kernel_isa, writable, masked, self.mask_rows)
            return DeviceSample(greedy_tokens(cut))
        raw = logits if logits.dtype == torch.float32 else logits.float()
        # the logprobs rows' raw logits apart (a copy of those rows, not of the batch's):
        # then masks and penalties may write the step's logits (or float's copy) in place
        lp_raw = lp_sel = None
        if batch.logprobs:
            lp_sel = _column(cols, "logprobs", batch.logprobs, raw.device, torch.long)
            lp_raw = raw.index_select(0, lp_sel)
        in_place = writable or raw is not logits
        cut = apply_token_masks(raw, rows, self.kernel_isa, in_place, masked, self.mask_rows)
        stopped = mask_stop_tokens(cut, rows, self.eos_token_ids, batch.min_tokens)
        biased = apply_logit_bias(stopped, rows, batch.biased)
        pen = (batch.penalized, batch.values, self.batch.counts)  # counts: kept by slot
        pen_op = penalty_op(self.penalize_rows, self.kernel_isa, raw.device)
        processed = apply_penalties(
            biased, rows, prev_tokens, *pen, cols, in_place, batch.memo, pen_op
        )
        rand, op = batch.draws, self.draw_op(processed.device)
        if rand and op is not None:  # every row in the backend's one op
            n = num_uniforms(processed.shape[1])
            memo, keys = batch.memo, self.keys
            tokens = kernel_sample(processed, rows, rand, batch.values, n, op, cols, memo, keys)
        elif len(rand) == len(rows):
            tokens = self._sample(processed, rows, batch.values, cols)
        else:
            tokens = greedy_tokens(processed)  # greedy rows: the penalized logits' argmax
            if rand:
                sel = _column(cols, "draws", rand, tokens.device, torch.long)
                drawn = self._sample(
                    processed.index_select(0, sel),
                    list(map(rows.__getitem__, rand)),
                    batch.values[rand],
                    cols,
                )
                tokens.index_copy_(0, sel, drawn)
        if lp_raw is None or lp_sel is None:
            return DeviceSample(tokens)
        return self._logprobs(lp_raw, lp_sel, tokens, batch.num_top, batch.logprobs)

    def draw_op(self, device: torch.device) -> DrawRows | None:
        """The draw op for logits on `device`: the backend's, else the C++ one; None: torch's."""
        if self.draw_rows is not None and self.draw_rows.device == device.type:
            return self.draw_rows
        isa = self.kernel_isa if runs_cpu_kernels(device) else None
        return None if isa is None else cpu_draw_rows(isa)

    @staticmethod
    def plain_greedy(rows: Rows) -> bool:
        """Every row takes the argmax of its raw logits (after any grammar mask): greedy,
        with no penalty, no logit_bias, no logprobs and no min_tokens still blocking EOS."""
        return all(
            plain_greedy_params(r.params)
            and len(r.output_token_ids) + len(r.draft_token_ids) >= r.params.min_tokens
            for r in rows
        )

    def argmax_only(self, rows: Rows) -> bool:
        """plain_greedy(rows), the parameters' part kept between steps (BatchParams)."""
        batch = self.batch.of_rows(rows)
        return batch.plain and self.plain_greedy([rows[i] for i in batch.min_tokens])

    def greedy(self, logits: torch.Tensor) -> DeviceSample:
        """A batch of plain greedy rows with no grammar mask (Request.plain): the argmax."""
        return DeviceSample(greedy_tokens(logits[:, : self.vocab_size]))

    @staticmethod
    def _sample(
        logits: torch.Tensor,
        rows: Rows,
        values: np.ndarray,
        cols: DeviceColumns | None = None,
    ) -> torch.Tensor:
        """Draw for rows (values: their numbers, batch_params.values_of's columns)."""
        probs = sampling_probs(logits, values, cols)
        u = draw_uniforms(rows, values, num_uniforms(probs.shape[1]), probs.device, cols)
        return sample_from(probs, u)

    def _logprobs(
        self,
        raw_rows: torch.Tensor,
        sel: torch.Tensor,
        tokens: torch.Tensor,
        num_top: list[int],
        idx: list[int],
    ) -> DeviceSample:
        """The sample with logprobs for rows `idx` (sel: idx on the device; their raw
        logits: raw_rows; num_top: each one's N). On the CPU kernels one op
        (draws.kernel_logprobs)."""
        picked, n = tokens.index_select(0, sel), max(num_top)
        top_lps: torch.Tensor | None
        top_ids: torch.Tensor | None
        if self.kernel_isa is not None:
            sampled_lp, top_lps, top_ids = kernel_logprobs(raw_rows, picked, n, self.kernel_isa)
        else:
            lp = raw_rows.log_softmax(dim=-1)
            sampled_lp = lp.gather(1, picked.unsqueeze(1)).select(1, 0)
            top_lps, top_ids = lp.topk(n, dim=-1) if n > 0 else (None, None)
        sample = DeviceSample(tokens, idx, num_top, sampled_lp)
        if n > 0:
            sample.top_logprobs, sample.top_ids = top_lps, top_ids
        return sample


def prompt_logprob_entries(
    logits: torch.Tensor, targets: Sequence[int], num_top: int
) -> list[list | None]:
    """Per row of logits [n, vocab] (the row before each target token): [target, its
    logprob, [[id, logprob], ...top num_top]], from the raw logits' log-softmax (as
    transformers': no temperature or penalties)."""
    lp = logits.float().log_softmax(dim=-1)
    ids = torch.tensor(list(targets), dtype=torch.long, device=lp.device)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()
    if num_top > 0:
        values, indices = lp.topk(num_top, dim=-1)
        tops = [
            [[t, v] for t, v in zip(row_ids, row_vals)]
            for row_ids, row_vals in zip(indices.tolist(), values.tolist())
        ]
    else:
        tops = [[] for _ in chosen]
    return [[t, v, top] for t, v, top in zip(targets, chosen, tops)]
