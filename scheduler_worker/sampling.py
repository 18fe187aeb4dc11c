"""Sampling for the whole batch at once.

Order of logit processing (per row, vectorized over the batch):
    min_tokens mask (EOS and stop ids) → repetition penalty (prompt + output, HF rule)
    → presence/frequency penalties (output only, OpenAI rule) → temperature
    → top-k → top-p → min-p → draw.
Greedy rows take the argmax of the processed logits; a batch of plain greedy rows takes
one argmax and nothing else.

Seeded rows draw from their own generator with the exponential race
(argmax(p / q), q ~ Exp(1)), one draw of V values per step, so a request's samples do not
depend on what else is in its batch. Logprobs come from the raw model logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None


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
    g.manual_seed(seed % (1 << 64))
    return g


def _has_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 or p.frequency_penalty != 0.0


def _padded(seqs: list[Sequence[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for i, s in enumerate(seqs):
        if s:
            ids[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
            mask[i, : len(s)] = True
    return ids.to(device), mask.to(device)


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition (HF: over prompt+output, logit>0 divided, <0 multiplied) and OpenAI
    presence/frequency (over output: logit -= presence*[count>0] + frequency*count)."""
    idx = [i for i, r in enumerate(rows) if _has_penalty(r.params)]
    if not idx:
        return logits
    dev, vocab = logits.device, logits.shape[1]
    sub = logits[idx]
    rep = torch.tensor([rows[i].params.repetition_penalty for i in idx], device=dev)[:, None]
    if (rep != 1.0).any():
        ids, mask = _padded([list(rows[i].prompt_token_ids) + list(rows[i].output_token_ids)
                             for i in idx], dev)
        seen = torch.zeros_like(sub, dtype=torch.bool).scatter_(1, ids, mask)
        penalized = torch.where(sub > 0, sub / rep, sub * rep)
        sub = torch.where(seen, penalized, sub)
    pres = torch.tensor([rows[i].params.presence_penalty for i in idx], device=dev)[:, None]
    freq = torch.tensor([rows[i].params.frequency_penalty for i in idx], device=dev)[:, None]
    if (pres != 0).any() or (freq != 0).any():
        ids, mask = _padded([rows[i].output_token_ids for i in idx], dev)
        counts = torch.zeros(len(idx), vocab, device=dev).scatter_add_(1, ids, mask.float())
        sub = sub - pres * (counts > 0).float() - freq * counts
    logits = logits.clone()
    logits[idx] = sub
    return logits


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        logits = logits.float()
        raw = logits
        params = [r.params for r in rows]
        blocked = [len(r.output_token_ids) < r.params.min_tokens for r in rows]
        want_lp = [p.logprobs is not None for p in params]
        if all(p.greedy for p in params) and not any(blocked) and not any(want_lp) \
                and not any(_has_penalty(p) for p in params):
            return SamplerOutput(logits.argmax(-1).tolist(), [None] * len(rows))
        logits = logits.clone()
        for i, r in enumerate(rows):
            if blocked[i]:
                stop = [t for t in self.eos_token_ids + list(r.params.stop_token_ids) if t < logits.shape[1]]
                logits[i, stop] = float("-inf")
        logits = apply_penalties(logits, rows)
        tokens = self._sample(logits, rows)
        return SamplerOutput(tokens, self._logprobs(raw, tokens, params, want_lp))

    def _sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
        dev = logits.device
        params = [r.params for r in rows]
        greedy = torch.tensor([p.greedy for p in params], device=dev)
        temp = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=dev)
        scaled = logits / temp[:, None]
        top_k = [p.top_k for p in params]
        if any(k > 0 for k in top_k):
            k = torch.tensor([k if k > 0 else logits.shape[1] for k in top_k], device=dev)
            sorted_desc = scaled.sort(dim=-1, descending=True).values
            kth = sorted_desc.gather(1, (k - 1).clamp(max=logits.shape[1] - 1)[:, None])
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        top_p = torch.tensor([p.top_p for p in params], device=dev)
        if (top_p < 1.0).any():
            sorted_p, order = probs.sort(dim=-1, descending=True)
            cum_before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
            drop_sorted = cum_before >= top_p[:, None]
            drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
        min_p = torch.tensor([p.min_p for p in params], device=dev)
        if (min_p > 0).any():
            thresh = probs.max(dim=-1, keepdim=True).values * min_p[:, None]
            probs = probs.masked_fill(probs < thresh, 0.0)
        q = torch.empty_like(probs)
        shared = [i for i, r in enumerate(rows) if r.generator is None]
        if shared:
            q[shared] = torch.empty(len(shared), probs.shape[1], device=dev).exponential_()
        for i, r in enumerate(rows):
            if r.generator is not None:
                q[i].exponential_(generator=r.generator)
        sampled = (probs / q).argmax(-1)
        return torch.where(greedy, scaled.argmax(-1), sampled).tolist()

    @staticmethod
    def _logprobs(raw: torch.Tensor, tokens: list[int], params: list[SamplingParams],
                  want: list[bool]) -> list[TokenLogprobs | None]:
        out: list[TokenLogprobs | None] = [None] * len(tokens)
        idx = [i for i, w in enumerate(want) if w]
        if not idx:
            return out
        lp = torch.log_softmax(raw[idx], dim=-1)
        n = max(params[i].logprobs or 0 for i in idx)
        top_v, top_i = lp.topk(max(n, 1), dim=-1)
        for j, i in enumerate(idx):
            k = params[i].logprobs or 0
            out[i] = TokenLogprobs(tokens[i], lp[j, tokens[i]].item(),
                                   top_i[j, :k].tolist(), top_v[j, :k].tolist())
        return out
