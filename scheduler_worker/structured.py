"""Constrained decoding in the engine: one llguidance matcher per constrained request.

    add(req) ─▶ matcher (a copy of the spec's compiled one, cached by spec text)
    step N:  start(rows) ─▶ packed token bitmask of every constrained row ─┐
             forward N (model) ...                                        │
             wait() ◀─────────────────────────────────────────────────────┘
             sampler: -inf where the bitmask forbids ─▶ advance(req, token)
    a drafted row (speculative decoding): check_drafts(batch) ─▶ its drafts cut at the first
             token refused, a mask for each of its 1 + k positions (spec/verify.py masks
             the leading k, the sampler the last) ─▶ advance_all(req, tokens kept)
    overlapped, a row whose token N-1 is still in flight when step N launches:
             forward N launched ─▶ step N-1's tokens read ─▶ advance_ahead(rows, tokens)
             ─▶ start(rows, at_once=True) ─▶ sampler (its resolve takes advanced()'s answer)
    finish / abort ─▶ drop(rid)

The mask a row needs after forward N depends only on the tokens sampled up to step N-1.
Where a core is left over beside torch's threads, it is computed in a thread while
forward N runs (llguidance's mask computation and torch's ops both release the GIL).
Where torch has every core (the default), start() computes it at once instead: a thread
would take a core from one of the forward's threads in the middle of a parallel region,
and the other would wait at its barrier, which cost twice the mask's own time
(docs/benchmarks.md, "Structured outputs: the cost of grammar masks"). The masks stay
llguidance's packed words (int32, bit j of word w = token 32 w + j allowed) all the way
to the sampler, whose C++ op reads them directly. EOS (every id the engine stops on) is
allowed when the matcher accepts, or where the grammar names it; a request whose matcher
is stopped (nothing but EOS could follow) finishes there ("stop"). One whose matcher
refuses its token (a limit of llguidance's passed mid-way, e.g. 2,000 items in an Earley
row) fails with an error (refusal), never a "stop" that breaks its grammar.

Preemption by recompute keeps the request's output tokens, so its matcher (which has
consumed exactly those tokens) stays valid as is; `rebuild` replays them into a fresh
matcher for a request whose matcher is lost or out of step.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from operator import attrgetter, itemgetter
from pathlib import Path

import llguidance
import llguidance.numpy as llg_np
import numpy as np
import torch

from common.grammar import GrammarError, check, grammar_text, llg_tokenizer
from common.log import get_logger
from common.sampling_params import InvalidParameterError
from scheduler_worker.request import Request, RequestStatus
from scheduler_worker.scheduled_batch import ScheduledBatch

log = get_logger("structured")
_RID, _FIRST = attrgetter("request_id"), itemgetter(0)


def _error(m: llguidance.LLMatcher) -> str:
    """A matcher's error, its first line: not the state and the whole grammar after it."""
    return m.get_error().split("\n", 1)[0][:300]


MAX_CACHED_GRAMMARS = 256


def spare_core(replicas: int = 1) -> bool:
    """Whether a core is left over beside torch's threads, with `replicas` engines (each
    with as many threads) on this process's cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cores or 1) > replicas * torch.get_num_threads()


def masks_overlap(device_runs_forward: bool, replicas: int = 1) -> bool:
    """Whether a step's masks are made in the mask thread while its forward runs: where
    the device runs the forward (a GPU: the backend's execute returns before it is done)
    the host's cores are free for it, and made at once they would hold back the forward's
    launch; on a CPU only a core spare beside torch's threads is (spare_core)."""
    return device_runs_forward or spare_core(replicas)


class GrammarMatchers:
    def __init__(self, model_dir: Path, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.model_dir, self.vocab_size = model_dir, vocab_size
        # masks in the thread during the forward (a spare core), or at once; the scheduler
        # worker sets it again knowing how many replicas share the cores
        self.overlap = spare_core()
        self.eos_token_ids = [t for t in eos_token_ids if t < vocab_size]
        self.matchers: dict[str, llguidance.LLMatcher] = {}  # rid -> its matcher
        self.requests: dict[str, Request] = {}  # rid -> the request (its matcher's)
        self.ahead: dict[str, bool] = {}  # rid -> advance()'s answer, taken before the resolve
        self.refused: dict[str, str] = {}  # rid -> the error its grammar broke with (refusal)
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()  # fresh ones
        # the mask thread; it first builds the llguidance tokenizer (0.5 s for 49k tokens,
        # 1.7-1.8 s for Gemma 3's 262k from a converted GGUF's compact tokenizer.json:
        # common.model_files.tokenizer_files), holding the GIL all along: the engine waits for it
        # before it serves (wait_tokenizer), because a build during a request would starve
        # the heartbeat thread too, and the frontend would take the replica for dead
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._tokenizer = self._pool.submit(llg_tokenizer, str(model_dir), vocab_size)
        # the masks' words, kept between steps with a torch view of each row (_masks): a
        # step's are copied or read by the sampler before the next step's are filled
        self._words = np.empty((0, -(-vocab_size // 32)), np.int32)
        self._rows: tuple[torch.Tensor, ...] = ()
        # seconds the engine's steps spent on masks: making them (at once), or waiting for
        # the thread after the forward (overlap)
        self.step_time = 0.0

    def wait_tokenizer(self) -> None:
        """Block until the llguidance tokenizer is built (a failure is kept for the first
        constrained request, which it refuses)."""
        wait([self._tokenizer])

    def __contains__(self, rid: str) -> bool:
        return rid in self.matchers

    def __len__(self) -> int:
        return len(self.matchers)

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        try:
            return self._tokenizer.result()
        except Exception as e:  # e.g. a model directory without tokenizer.json
            raise InvalidParameterError(
                "structured", f"structured outputs are not available for this model: {e}"
            ) from None

    def compiled(self, structured: dict[str, str]) -> llguidance.LLMatcher:
        """A fresh matcher for the spec, compiled once per process (copied for each use)."""
        key = json.dumps(structured, sort_keys=True)
        m = self._compiled.get(key)
        if m is None:
            try:
                grammar = grammar_text(structured)
                check(grammar, lambda: self.tokenizer)
            except GrammarError as e:
                raise InvalidParameterError("structured", f"structured: {e}") from None
            m = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
            if m.is_error():
                raise InvalidParameterError("structured", f"structured: {_error(m)}")
            self._compiled[key] = m
            if len(self._compiled) > MAX_CACHED_GRAMMARS:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return m.deep_copy()

    def add(self, req: Request) -> None:
        """A matcher for a constrained request (InvalidParameterError if its spec fails)."""
        if req.params.structured is not None:
            self.matchers[req.request_id] = self.compiled(req.params.structured)
            self.requests[req.request_id] = req
            if req.output_token_ids:
                self.rebuild(req)

    def rebuild(self, req: Request) -> None:
        """A fresh matcher advanced by the request's output tokens (its state replayed)."""
        assert req.params.structured is not None
        m = self.matchers[req.request_id] = self.compiled(req.params.structured)
        for t in req.output_token_ids:
            if t in self.eos_token_ids or not m.consume_token(t):
                break

    def drop(self, rid: str) -> None:
        self.matchers.pop(rid, None)
        self.requests.pop(rid, None)
        self.ahead.pop(rid, None)
        self.refused.pop(rid, None)

    # ---- masks ----------------------------------------------------------------------------
    def start(
        self,
        rows: list[Request],
        drafted: dict[str, torch.Tensor] | None = None,
        at_once: bool = False,
    ) -> Future[dict[int, torch.Tensor]] | None:
        """Begin the masks of the constrained ones among `rows` (the batch's sampling rows,
        in order); wait() gives {row index: int32 [W] packed bitmask}. None if none is
        constrained. A row with `drafted` masks (check_drafts) samples after its drafts:
        its last one. `at_once`: not in the thread (the caller waits for them next)."""
        if not self.matchers:  # no constrained request anywhere: nothing to do
            return None
        todo, known = [], {}
        if drafted or len(self.matchers) * 4 > len(rows):
            for i, r in enumerate(rows):
                if drafted and r.request_id in drafted:
                    known[i] = drafted[r.request_id][-1]
                elif r.request_id in self:
                    todo.append((i, self.matchers[r.request_id]))
        else:  # few constrained rows: each found at its row of the step before where the
            todo = self._rows_of(rows)  # batch kept it there (a steady decode), else by id
        if not todo and not known:
            return None
        if self.overlap and todo and not at_once:
            return self._pool.submit(lambda: {**known, **self._masks(todo)})
        t0 = time.perf_counter()
        done: Future[dict[int, torch.Tensor]] = Future()
        done.set_result({**known, **self._masks(todo)} if todo else known)
        self.step_time += time.perf_counter() - t0
        return done

    def _rows_of(self, rows: list[Request]) -> list[tuple[int, llguidance.LLMatcher]]:
        """(row in `rows`, matcher) of each constrained request among them, by row. A
        request at its flight_row (its row in the step before) is found there, checked by
        identity: an index of every row's id (~170 instructions a row) is made only when
        one running is not (the batch changed)."""
        n, where, found = len(rows), None, []
        for rid, m in self.matchers.items():
            req = self.requests[rid]
            i = req.flight_row
            if 0 <= i < n and rows[i] is req:
                found.append((i, m))
            elif req.status is not RequestStatus.WAITING:  # queued: in no step's rows
                if where is None:
                    where = dict(zip(map(_RID, rows), range(n)))
                if rid in where:
                    found.append((where[rid], m))
        return sorted(found, key=_FIRST) if len(found) > 1 else found

    def wait(self, pending: Future[dict[int, torch.Tensor]] | None) -> dict[int, torch.Tensor]:
        if pending is None:
            return {}
        t0 = time.perf_counter()
        masks = pending.result()
        self.step_time += time.perf_counter() - t0
        return masks

    def _masks(self, todo: list[tuple[int, llguidance.LLMatcher]]) -> dict[int, torch.Tensor]:
        # row by row on this thread, their EOS bits set together (_eos): 10 masks inside a
        # JSON string ~33 µs, where llguidance's batch fill on a pool of its own took
        # 45-115 µs, most of it handing the batch to its thread and back (docs/benchmarks.md,
        # "The masks filled on the engine's thread"); a pool per core fought torch's threads
        # for the cores ("Structured outputs: the cost of grammar masks")
        n, words = len(todo), self._words
        if len(words) < n:
            words = self._words = np.empty((2 * n, words.shape[1]), np.int32)
            self._rows = torch.from_numpy(words).unbind(0)
        at, row = words.ctypes.data, words.shape[1] * 4  # row j at at + j * row: C order
        for j, (_, m) in enumerate(todo):  # llguidance.numpy's fill without its checks
            m.unsafe_compute_mask_ptr(at + j * row, row)
        self._eos(words[:n], [m.is_accepting() for _, m in todo])
        return dict(zip(map(_FIRST, todo), self._rows))  # the first n rows

    def _fill(self, m: llguidance.LLMatcher, bitmask: np.ndarray, j: int) -> None:
        """Row j of bitmask: the tokens m allows next, its EOS bits as _eos sets them."""
        llg_np.fill_next_token_bitmask(m, bitmask, j)
        self._eos(bitmask[j : j + 1], [m.is_accepting()])

    def _eos(self, bitmask: np.ndarray, accepting: list[bool]) -> None:
        """Every EOS id the engine stops on (not only llguidance's) allowed in row j of
        bitmask where its matcher accepts (accepting[j]); elsewhere only where the grammar
        itself names it (`start: "a" <|im_end|>`), as llguidance's mask says."""
        words = bitmask.view(np.uint32)
        for t in self.eos_token_ids:  # as Python ints: ~2 µs for 1 row or 16, where numpy's
            w, bit = t >> 5, 1 << (t & 31)  # ops on the column took ~5 and on each row ~1
            column = words[:, w].tolist()
            words[:, w] = [x | bit if a else x for x, a in zip(column, accepting)]

    # ---- speculative decoding (scheduler_worker/spec/) ------------------------------------
    def check_drafts(self, batch: ScheduledBatch) -> dict[str, torch.Tensor]:
        """Cut each constrained row's drafts at the first token its grammar refuses (and
        after a token that ends the row: a stop token, or one that completes the grammar),
        and make its masks for the 1 + k positions of its chunk: int32 [1 + k, W], row i
        the grammar's state after drafts 1..i (the matcher is walked through them, then
        rolled back). An EOS leaves the state as it was, as in advance()."""
        out: dict[str, torch.Tensor] = {}
        if not self.matchers:
            return out
        t0 = time.perf_counter()
        for rid, drafts in list(batch.drafts.items()):
            m = self.matchers.get(rid)
            if m is None:
                continue
            req = batch.entries[rid][0]
            bitmask = llg_np.allocate_token_bitmask(1 + len(drafts), self.vocab_size)
            words = bitmask.view(np.uint32)
            kept = consumed = 0
            while True:
                self._fill(m, bitmask, kept)
                if kept == len(drafts) or m.is_stopped():
                    break
                t = drafts[kept]
                if not words[kept, t >> 5] >> (t & 31) & 1:
                    break  # refused
                kept += 1
                if t in req.stop_tokens:  # the row ends here if it is accepted: the
                    bitmask[kept] = bitmask[kept - 1]  # token after it is never sent
                    break
                if t not in self.eos_token_ids:
                    if not m.consume_token(t):  # the mask allowed it: not expected
                        log.warning("%s: grammar refused draft %d: %s", rid, t, _error(m))
                        self.rebuild(req)
                        consumed, kept = 0, kept - 1
                        break
                    consumed += 1
            m.rollback(consumed)
            if kept < len(drafts):
                batch.cut_drafts(req, kept)
            out[rid] = torch.from_numpy(bitmask[: kept + 1])
        self.step_time += time.perf_counter() - t0
        return out

    def advance_all(self, req: Request, tokens: list[int]) -> tuple[list[int], bool]:
        """advance() by each of a row's verified tokens: those up to the one that stops it
        (its grammar complete or broken: True), or up to a stop token (Scheduler.accept
        ends the row there)."""
        for j, t in enumerate(tokens):
            if self.advance(req, t):
                return tokens[: j + 1], True
            if t in req.stop_tokens:
                return tokens[: j + 1], False
        return tokens, False

    # ---- after sampling -------------------------------------------------------------------
    def advance_ahead(self, rows: Sequence[Request], token_ids: Sequence[int]) -> None:
        """Overlapped: rows of the step in flight launched again, whose masks need the
        token in flight (`token_ids`, that step's, each row's at its flight_row): each
        matcher takes it before the step resolves, which then reads the answer here
        (advanced)."""
        for req in rows:
            self.ahead[req.request_id] = self.advance(req, token_ids[req.flight_row])

    def advanced(self, req: Request, token: int) -> bool:
        """advance(req, token), unless advance_ahead took that token already: its answer."""
        done = self.ahead.pop(req.request_id, None)
        return self.advance(req, token) if done is None else done

    def advance(self, req: Request, token: int) -> bool:
        """Consume the token sampled for req; True when the request must stop here: its
        grammar is complete (only EOS could follow) or broken (logged)."""
        m = self.matchers.get(req.request_id)
        if m is None or token in self.eos_token_ids:
            return False
        if not m.consume_token(token):
            error = _error(m)
            log.warning("%s: grammar refused token %d: %s", req.request_id, token, error)
            self.refused[req.request_id] = f"structured: the grammar could not go on: {error}"
            return True
        return m.is_stopped()

    def refusal(self, req: Request) -> str | None:
        """The error of a request whose grammar refused its sampled token (a limit of the
        grammar library's passed, or nothing it allows left to sample), once: it must
        fail with it, not stop as if complete."""
        return self.refused.pop(req.request_id, None)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
