"""Sampling for the whole batch at once.

Logit processing, each step vectorized over the rows that need it:

    raw logits ─┬─▶ grammar mask (constrained rows) ─▶ min_tokens mask (EOS + stop ids)
                │   ─▶ repetition penalty (prompt+output, HF)
                │   ─▶ presence/frequency penalties (output, OpenAI) ─┬─▶ argmax (greedy rows)
                │                                                     │
                │   ┌─────────────────────────────────────────────────┘ (other rows)
                │   └─▶ / temperature ─▶ top-k ─▶ softmax ─▶ top-p ─▶ min-p
                │       ─▶ exponential race: a block of 256 tokens, then a token in it
                └─▶ log_softmax ─▶ logprobs (sampled token + top-N)

A batch of plain greedy rows (no penalties, logprobs, grammar or min_tokens still
blocking) takes one argmax and nothing else; without grammar masks the engine first asks
the model for the argmax itself (ModelRunner.execute), and where a quantized head takes it
without writing the logits the step never reaches the sampler. Logprobs are the model's
own, before the grammar mask (as before penalties and temperature): a token the grammar
forbids keeps its logprob in the top-N. Temperatures below GREEDY_EPS count as greedy.

Drawing (`sample_from`): an exponential race (argmax p / q, q ~ Exp(1)) among blocks of
SAMPLE_BLOCK tokens by their sums, then among the tokens of the block that won: the
tokens come out with probability p / sum(p), from ~450 random numbers per row where a
race over the whole vocabulary draws a random number and a log per token (~10 ms of a
~35 ms step at 32 rows on 2 cores, against ~1 ms). A race keeps what the one over the
vocabulary had: a logit that moves by an ulp changes the winner only at a near-tie (an
inverse CDF would add the rounding up over the vocabulary). Seeds: a seeded row draws its
uniforms from its own generator, so its samples do not depend on what else is in the
batch; unseeded rows share the default generator.
Top-k and top-p cut by value: tokens tied with the last one kept are kept too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from common.sampling_params import SamplingParams

GREEDY_EPS = 1e-5  # temperatures below this are greedy: logits / T would overflow
TOP_P_CANDIDATES = (256, 4096)  # on a CPU, top-p tries these many tokens before a full sort
SAMPLE_BLOCK = 256  # tokens per block of the two-level race (sample_from)


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None
    # structured outputs: the grammar's packed bitmask, int32 [ceil(vocab / 32)], bit j of
    # word w set where token 32 w + j is allowed (scheduler_worker.structured)
    token_bitmask: torch.Tensor | None = None


@dataclass
class TokenLogprobs:
    token_id: int
    logprob: float
    top_ids: list[int]
    top_logprobs: list[float]


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed % (1 << 64))  # validated seeds may be negative
    return g


def is_greedy(p: SamplingParams) -> bool:
    return p.top_k == 1 or p.temperature < GREEDY_EPS


def has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _flat_index(
    seqs: list[Sequence[int]], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token id) index pairs for every token (< vocab) of every sequence."""
    lens = torch.tensor([len(s) for s in seqs])
    rows = torch.repeat_interleave(torch.arange(len(seqs)), lens)
    ids = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.long)
    keep = ids < vocab
    return rows[keep].to(device), ids[keep].to(device)


def mask_stop_tokens(
    logits: torch.Tensor, rows: list[SamplingRow], eos_token_ids: Sequence[int]
) -> torch.Tensor:
    """EOS and stop ids get -inf in rows that have fewer than min_tokens outputs."""
    vocab = logits.shape[1]
    row_idx: list[int] = []
    tok_idx: list[int] = []
    for i, r in enumerate(rows):
        if len(r.output_token_ids) < r.params.min_tokens:
            stop = [t for t in chain(eos_token_ids, r.params.stop_token_ids) if t < vocab]
            row_idx += [i] * len(stop)
            tok_idx += stop
    if not row_idx:
        return logits
    logits = logits.clone()
    logits[row_idx, tok_idx] = float("-inf")
    return logits


def apply_token_masks(
    logits: torch.Tensor, rows: list[SamplingRow], isa: int | None = None, in_place: bool = False
) -> torch.Tensor:
    """-inf where a constrained row's grammar forbids the token: into `logits` when
    in_place (and they are contiguous), else into a copy. With the C++ kernels (`isa`:
    their path) a float32 CPU batch takes one op straight from the packed words (this runs
    on the decode critical path, between the forward and the sample); else the words are
    expanded to bools in torch."""
    idx = [i for i, r in enumerate(rows) if r.token_bitmask is not None]
    if not idx:
        return logits
    if in_place and logits.is_contiguous():
        out = logits  # a copy of [32, 49152] float32 cost ~0.5 ms a step, from DRAM
    else:
        out = logits.clone(memory_format=torch.contiguous_format)
    words = [rows[i].token_bitmask.to(out.device) for i in idx]  # type: ignore[union-attr]
    if isa is not None and out.device.type == "cpu" and out.dtype == torch.float32:
        torch.ops.zeroserve.token_bitmask_(out, idx, words, isa)
        return out
    vocab = out.shape[1]
    shifts = torch.arange(32, dtype=torch.int32, device=out.device)
    bits = ((torch.stack(words).unsqueeze(-1) >> shifts) & 1).view(len(idx), -1)[:, :vocab]
    allowed = torch.zeros(len(idx), vocab, dtype=torch.bool, device=out.device)
    allowed[:, : bits.shape[1]] = bits.bool()  # tokens beyond the words' 32 W: forbidden
    out[idx] = out[idx].masked_fill(~allowed, float("-inf"))
    return out


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition (HF: over prompt+output, logit>0 divided, <0 multiplied) and OpenAI
    presence/frequency (over output: logit -= presence*[count>0] + frequency*count).
    Returns a new tensor; rows without penalties are unchanged."""
    idx = [i for i, r in enumerate(rows) if has_penalty(r.params)]
    if not idx:
        return logits
    dev = logits.device
    params = [rows[i].params for i in idx]
    sub = logits[idx]  # a copy
    rep = torch.tensor([p.repetition_penalty for p in params], device=dev)[:, None]
    if any(p.repetition_penalty != 1.0 for p in params):
        seqs = [
            chain(rows[i].prompt_token_ids, rows[i].output_token_ids)
            if p.repetition_penalty != 1.0
            else ()
            for i, p in zip(idx, params)
        ]
        seen = torch.zeros_like(sub, dtype=torch.bool)
        seen[_flat_index([list(s) for s in seqs], sub.shape[1], dev)] = True
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    pres = torch.tensor([p.presence_penalty for p in params], device=dev)[:, None]
    freq = torch.tensor([p.frequency_penalty for p in params], device=dev)[:, None]
    if any(p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 for p in params):
        counts = torch.zeros_like(sub)
        r, t = _flat_index([rows[i].output_token_ids for i in idx], sub.shape[1], dev)
        counts.index_put_((r, t), torch.ones_like(t, dtype=sub.dtype), accumulate=True)
        sub = sub - pres * (counts > 0).to(sub.dtype) - freq * counts
    out = logits.clone()
    out[idx] = sub
    return out


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k (on logits), top-p and min-p (on the probabilities that top-k
    left): unnormalized probabilities with the filtered tokens at 0."""
    dev, vocab = logits.device, logits.shape[1]
    if any(p.temperature != 1.0 for p in params):
        logits = logits / torch.tensor([p.temperature for p in params], device=dev)[:, None]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(ks):
        k = torch.tensor([k or 1 for k in ks], device=dev)[:, None]
        kth = logits.topk(max(ks), dim=-1).values.gather(1, k - 1)
        kth.masked_fill_(k.new_tensor(ks)[:, None] == 0, float("-inf"))  # top-k off here
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(dim=-1)
    # an extreme penalty or temperature can push logits to +inf (a repetition_penalty of
    # 1e-38 divides them by it), and a +inf or NaN logit makes its whole row NaN: such
    # rows again with the largest finite value for +inf (one pass over the rest is saved)
    bad = probs[:, 0].isnan()
    if bool(bad.any()):
        fixed = torch.nan_to_num(
            logits[bad], nan=float("-inf"), posinf=torch.finfo(logits.dtype).max
        )
        probs[bad] = fixed.softmax(dim=-1)
    thresh = probs.new_zeros(len(params), 1)  # the smallest probability each row keeps
    top_p_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if top_p_rows:
        top_p = torch.tensor([params[i].top_p for i in top_p_rows], device=dev)[:, None]
        thresh[top_p_rows] = _top_p_threshold(probs[top_p_rows], top_p)
    if any(p.min_p > 0.0 for p in params):
        min_p = torch.tensor([p.min_p for p in params], device=dev)[:, None]
        thresh = torch.maximum(thresh, probs.amax(dim=-1, keepdim=True) * min_p)
    if top_p_rows or any(p.min_p > 0.0 for p in params):
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
    """argmax p / q with q = -log(u) ~ Exp(1), as argmin p / log(u): log(u) < 0, a u of 0
    gives q = inf (that entry cannot win) and a p of 0 never wins over a positive one."""
    return (p / u.log()).argmin(dim=-1)


def _top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Per row, the probability of the last token of the smallest set (by descending
    probability) holding top_p of the mass. Sorting the whole vocabulary is slow on a
    CPU, so there the most likely TOP_P_CANDIDATES[0] tokens are tried first, and only
    the rows where they hold less than top_p go on to the next size, up to a full sort."""
    vocab = probs.shape[1]
    on_cpu = probs.device.type == "cpu"
    sizes = [n for n in TOP_P_CANDIDATES if n < vocab and on_cpu] + [vocab]
    thresh = torch.empty_like(top_p)
    todo = torch.arange(probs.shape[0], device=probs.device)
    for num in sizes:
        sub = probs[todo]
        top = sub.sort(dim=-1, descending=True).values if num == vocab else sub.topk(num).values
        done = (top.sum(dim=-1) >= top_p[todo, 0]) | (num == vocab)
        thresh[todo[done]] = _cut(top[done], top_p[todo[done]])
        todo = todo[~done]
        if len(todo) == 0:
            break
    return thresh


def _cut(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs  # 0 for the first: always kept
    # at least one: a top_p that is 0 in float32 (< ~1e-45) or NaN probabilities keep none
    num_keep = (mass_above < top_p).sum(dim=-1, keepdim=True).clamp_(min=1)
    return sorted_probs.gather(1, num_keep - 1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """The argmax of each row (the first index of the largest value, as argmax gives, ties,
    infinities and NaN alike), through `max(dim=-1)`: torch's CPU argmax is a scalar loop,
    its max reduction is vectorized. [32, 262144] float32 logits (Gemma 3's vocabulary at
    32 streams), 2 threads of an Intel Xeon (kind amx): argmax 10.3 ms, max 2.4 ms; [32, 49152]
    (SmolLM2) 1.2 / 0.4 ms."""
    return logits.max(dim=-1).indices


class Sampler:
    def __init__(
        self, vocab_size: int, eos_token_ids: Sequence[int], kernel_isa: int | None = None
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.kernel_isa = kernel_isa  # the C++ kernels' path (grammar masks); None: torch

    def __call__(
        self, logits: torch.Tensor, rows: list[SamplingRow], writable: bool = False
    ) -> SamplerOutput:
        """One token per row. `writable`: the caller hands `logits` over (the engine, a
        step's own): grammar masks go into them in place unless a row asks for logprobs
        (which are the raw logits')."""
        assert logits.shape[0] == len(rows), f"{logits.shape[0]} logit rows for {len(rows)} rows"
        logits = logits[:, : self.vocab_size]  # drop padded vocab columns, if any
        params = [r.params for r in rows]
        if self.plain_greedy(rows):
            masked = apply_token_masks(logits, rows, self.kernel_isa, writable)
            return SamplerOutput(greedy_tokens(masked).tolist(), [None] * len(rows))
        raw = logits.float()
        in_place = writable and all(p.logprobs is None for p in params)
        masked = apply_token_masks(raw, rows, self.kernel_isa, in_place)
        processed = apply_penalties(mask_stop_tokens(masked, rows, self.eos_token_ids), rows)
        rand = [i for i, p in enumerate(params) if not is_greedy(p)]
        if len(rand) == len(rows):
            tokens = self._sample(processed, rows)
        else:
            tokens = greedy_tokens(processed)  # greedy rows: the penalized logits' argmax
            if rand:
                tokens[rand] = self._sample(processed[rand], [rows[i] for i in rand])
        return SamplerOutput(tokens.tolist(), self._logprobs(raw, tokens, params))

    @staticmethod
    def plain_greedy(rows: list[SamplingRow]) -> bool:
        """Every row takes the argmax of its raw logits (after any grammar mask): greedy,
        with no penalty, no logprobs and no min_tokens still blocking EOS."""
        return all(
            is_greedy(r.params)
            and not has_penalty(r.params)
            and r.params.logprobs is None
            and len(r.output_token_ids) >= r.params.min_tokens
            for r in rows
        )

    @staticmethod
    def _sample(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        probs = sampling_probs(logits, [r.params for r in rows])
        n = num_uniforms(probs.shape[1])
        u = torch.empty(len(rows), n, device=probs.device)
        shared = [i for i, r in enumerate(rows) if r.generator is None]
        if len(shared) == len(rows):
            u.uniform_()
        elif shared:
            u[shared] = torch.rand(len(shared), n, device=u.device)
        for i, r in enumerate(rows):
            if r.generator is not None:
                u[i].uniform_(generator=r.generator)
        return sample_from(probs, u)

    @staticmethod
    def _logprobs(
        raw: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]
    ) -> list[TokenLogprobs | None]:
        out: list[TokenLogprobs | None] = [None] * len(params)
        idx = [i for i, p in enumerate(params) if p.logprobs is not None]
        if not idx:
            return out
        lp = raw[idx].log_softmax(dim=-1)
        sampled = tokens[idx]
        sampled_lp = lp.gather(1, sampled[:, None])[:, 0].tolist()
        n = max(params[i].logprobs or 0 for i in idx)
        top_lp: list[list[float]] = [[] for _ in idx]
        top_ids: list[list[int]] = [[] for _ in idx]
        if n > 0:
            values, indices = lp.topk(n, dim=-1)
            top_lp, top_ids = values.tolist(), indices.tolist()
        for j, (i, tok) in enumerate(zip(idx, sampled.tolist())):
            k = params[i].logprobs or 0
            out[i] = TokenLogprobs(tok, sampled_lp[j], top_ids[j][:k], top_lp[j][:k])
        return out


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
