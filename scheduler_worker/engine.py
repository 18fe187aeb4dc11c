"""The engine: scheduler + model runner + sampler behind a step-level API.

add_request(rid, prompt_token_ids, params)   validate (unless checked upstream), queue
step() -> list[RequestOutput]                one forward: each request's new tokens
step_rows()                                  the same as columns (OutputColumns: the worker's)
abort(rid)                                   any state; idempotent
generate(prompts, params)                    offline loop on top of the above
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from itertools import compress
from operator import itemgetter
from pathlib import Path

import torch

from common.config import EngineConfig
from common.limits import RequestLimits
from common.log import get_logger
from common.model_facts import context_length, eos_token_ids
from common.model_files.model_source import resolve_model
from common.sampling_params import SamplingParams
from scheduler_worker.heap import keep_step_buffers_in_heap
from scheduler_worker.model_runner import ModelRunner
from scheduler_worker.offline import run_to_end
from scheduler_worker.request import Request, RequestStatus, mark_drafts, mark_masks, unmark
from scheduler_worker.resolve_rows import Fused, fusable, resolve_and_advance, resolve_rows
from scheduler_worker.sampling import DeviceSample, Sampler, TokenLogprobs
from scheduler_worker.scheduled_batch import ScheduledBatch
from scheduler_worker.scheduler import Scheduler
from scheduler_worker.spec import engine_drafter
from scheduler_worker.spec.overlap import DraftGate
from scheduler_worker.spec.sampled import SampledVerify, sample_drafts
from scheduler_worker.spec.verify import draft_targets, verified_output
from scheduler_worker.step_inputs import decode_rows, seq_inputs
from scheduler_worker.step_logprobs import RowLogprobs, token_logprobs
from scheduler_worker.step_output import (
    EngineCounters,
    InFlight,
    OutputColumns,
    RequestOutput,
    StepStats,
    keep_prompt_logprobs,
    last_output,
    request_output,
)
from scheduler_worker.structured import GrammarMatchers, masks_overlap

log = get_logger("engine")
_REQUEST = itemgetter(0)


class LLMEngine:
    def __init__(self, config: EngineConfig, model_dir: Path | None = None) -> None:
        self.config = config
        self.model_dir = (
            Path(model_dir)
            if model_dir
            else resolve_model(config.model.model, config.model.resolved_cache_dir)
        )
        keep_step_buffers_in_heap()  # before the model: its step buffers reused, not re-faulted
        self.runner = runner = ModelRunner(config, self.model_dir)
        args = runner.args
        self.max_model_len = context_length(args.hf_config, config.model.max_model_len)
        self.eos_token_ids = eos_token_ids(args.hf_config, self.model_dir)
        self.scheduler = Scheduler(
            config.scheduler.resolved(self.runner.backend.name),
            config.cache,
            self.runner.num_blocks,
            self.eos_token_ids,
            sliding_window=args.kv_window,
            drafter=engine_drafter(config, self.runner, self.model_dir, type(self)),
        )
        backend = self.runner.backend
        ops = (backend.host_ops_isa, backend.draw_rows, backend.penalize_rows, backend.mask_rows)
        self.sampler = Sampler(args.vocab_size, self.eos_token_ids, *ops)
        self.grammars = GrammarMatchers(self.model_dir, args.vocab_size, self.eos_token_ids)
        self.grammars.overlap = masks_overlap(backend.overlap)
        self.limits = RequestLimits(
            runner.vocab_size, self.max_model_len, runner.num_blocks, config.cache.block_size
        )
        self.requests: dict[str, Request] = {}  # unfinished requests
        self._aborted: list[Request] = []  # finished by abort() since the last step
        self.asking_prompt_logprobs: list[Request] = []  # ScheduledBatch.wants_prompt_logprobs
        self.counters = EngineCounters()
        self.last_step = StepStats()
        want = config.scheduler.async_scheduling  # on, or auto where the device overlaps
        # (not under tensor parallelism: the followers take each step's tokens from its inputs)
        self.overlap = (want == "on" or want == "auto" and backend.overlap) and runner.tp is None
        self.gate = DraftGate()  # overlapped: which steps resolve the one in flight to draft
        self._in_flight: InFlight | None = None  # overlapped: the step launched last
        self._marked: list[Request] = []  # rows the last launch gave a mask or drafts
        self.failed: list[tuple[str, str, int]] = []  # failed since take_failed()
        log.info("overlapped scheduling: %s", "on" if self.overlap else "off")
        log.info("speculative decoding: %s", self.scheduler.config.speculative_method)

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    def has_unfinished(self) -> bool:
        return bool(self.requests) or bool(self._aborted) or self._in_flight is not None

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def block_manager(self):
        return self.scheduler.blocks

    # ---- requests -----------------------------------------------------------
    def validate(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> None:
        """InvalidParameterError (RequestRejectedError: it can never fit) if the request
        cannot be served: the offline API's check, and the serving path's for a request
        nothing proves came through the frontend's intake (common.auth.passed_intake)."""
        params.validate(self.vocab_size)
        self.limits.check_token_ids(prompt_token_ids)
        self.limits.check(prompt_token_ids, params)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        checked: bool = False,
        prediction: Sequence[int] | None = None,
    ) -> None:
        """Queue a request. `checked`: validated at intake, its limits checked by a
        tokenizer worker whose model facts the frontend matched with this replica's, and
        this KV pool holds a whole context (check_kv_pool): nothing to check again."""
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if params.max_tokens is None:  # unset: settled for this prompt, on a copy (the
            params = replace(params)  # caller may share one SamplingParams among prompts)
            checked = False
        if not checked:
            self.validate(prompt_token_ids, params)
            if prediction is not None:  # OpenAI's predicted output (spec/prediction.py)
                self.limits.check_prediction(prediction)
        req = Request(request_id, list(prompt_token_ids), params, prediction_token_ids=prediction)
        self.grammars.add(req)  # structured outputs: its matcher
        if params.prompt_logprobs is not None:
            self.asking_prompt_logprobs.append(req)
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort(self, request_id: str) -> bool:
        """Abort in any state; frees its blocks now. False if unknown or already finished."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        last = len(req.token_ids) - req.num_pending - 1  # steps in flight's: no output
        self.scheduler.finish_at(req, last, RequestStatus.FINISHED_ABORTED)
        self.grammars.drop(request_id)
        self._aborted.append(req)
        return True

    # ---- the step -----------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """step_rows(), each row a RequestOutput."""
        return self.step_rows().outputs()

    def step_rows(self) -> OutputColumns:
        """Schedule, launch and (overlapped: the previous step's) resolve; returns the
        outputs of the step whose tokens reached the host (step_output.OutputColumns).

        Overlapped (a GPU): step N+1 is scheduled and launched before step N's tokens
        are read, its decode rows taking step N's tokens on the device (SeqInput.prev_row;
        penalties count them there too). A row whose grammar needs step N's token for its
        mask stays in: its forward launches with the others, then step N's tokens are
        read and its matcher takes its token, and its mask is made before the sample
        launches (as vLLM's and SGLang's overlapped structured outputs). A step with
        prompt logprobs to compute, or one whose rows draft (spec/overlap.py), resolves
        the step in flight first."""
        outputs = OutputColumns.of([request_output(r, []) for r in self._aborted])
        self._aborted.clear()
        t0, stats = time.perf_counter(), StepStats()
        drafting = self.gate.decide(self.scheduler) if self.overlap else None
        if drafting and self._in_flight is not None:  # a row drafts from its last token
            self._resolve(self._in_flight, stats, outputs)
            self._in_flight = None
        t1 = time.perf_counter()
        batch = self.scheduler.schedule(drafting)
        self.gate.settle(drafting, batch)
        stats.schedule = time.perf_counter() - t1
        pending, waits = self._in_flight, []
        if pending is not None and batch.resolves_first(self.overlap, self.asking_prompt_logprobs):
            self._resolve(pending, stats, outputs)
            pending = self._in_flight = None
            for req in [r for r, _ in batch.entries.values() if r.status.finished]:
                batch.drop(req)  # finished by the tokens just read
        elif pending is not None and self.grammars.matchers:  # masks after N's tokens
            waits = batch.grammar_waits(self.grammars.matchers)
        launched = None
        # the launched rows' advance in the pending rows' resolve loop (resolve_rows.py)
        fuse = fusable(self.scheduler, batch, pending.sampled) if pending is not None else None
        if batch.entries:
            try:
                launched = self._launch(batch, stats, fuse is None, waits)
            except torch.OutOfMemoryError as e:
                self._fail_step(batch, e)
        if pending is not None:
            self._resolve(pending, stats, outputs, launched, fuse)
        self._in_flight = launched
        if launched is not None and (not self.overlap or launched.verifies):
            self._resolve(launched, stats, outputs)
            self._in_flight = None
        for key in ("schedule", "forward", "sample"):
            self.counters.busy_time[key] += getattr(stats, key)
        if stats.num_decode and not stats.num_prefill_tokens:  # what drafts cost (spec/policy)
            drafts = sum(map(len, batch.drafts.values()))
            self.scheduler.policy.record(stats.num_decode, drafts, time.perf_counter() - t0)
        self.last_step = stats
        return outputs

    def _fail_step(self, batch: ScheduledBatch, error: Exception) -> None:
        """The device ran out of memory in this step: its requests fail (the worker sends
        each an error, `take_failed`), their blocks go back, and the engine serves on."""
        what = f"{len(batch.entries)} request(s): they fail: {str(error).splitlines()[0][:200]}"
        log.error("out of device memory in a step of %s", what)
        for req, _ in list(batch.entries.values()):
            self._fail(req, "out of device memory in this request's step", 503)
        self.runner.backend.release_cached_memory()

    def _fail(self, req: Request, message: str, status: int) -> None:
        """`req` fails: its client gets an error, not an output (take_failed)."""
        if self.requests.pop(req.request_id, None) is not None:
            if not req.status.finished:
                self.scheduler.finish(req, RequestStatus.FINISHED_ABORTED)
            req.status = RequestStatus.FINISHED_ABORTED  # a stop that was a failure too
            self.grammars.drop(req.request_id)
            self.failed.append((req.request_id, message, status))

    def take_failed(self) -> list[tuple[str, str, int]]:
        """The requests failed since the last call: (id, message, HTTP status) each."""
        failed, self.failed = self.failed, []
        return failed

    @torch.inference_mode()  # the sampler writes masks into the step's (inference) logits
    def _launch(
        self,
        batch: ScheduledBatch,
        stats: StepStats,
        advance: bool = True,
        waits: Sequence[Request] = (),
    ) -> InFlight:
        """The step's forward and sampling run on the device, its tokens copied to the host;
        its rows advance, tokens placeholders (Scheduler.advance; else in _resolve).
        `waits`: grammar rows whose masks need the tokens in flight (made after the forward)."""
        t1 = time.perf_counter()
        entries = list(batch.entries.values())
        sampling = batch.sampling()
        stats.num_decode, stats.num_prefill_tokens = batch.num_decode, batch.num_prefill_tokens
        decode_only = batch.num_decode == len(entries)  # every row samples
        samplers = list(compress(map(_REQUEST, entries), sampling))
        # constrained rows' drafts: cut where the grammar refuses, a mask per position; the
        # rows' masks (during the forward where a core is spare, else now: structured.py)
        spec_masks = self.grammars.check_drafts(batch) if batch.drafts else {}
        masks = None if waits else self.grammars.start(samplers, spec_masks)
        constrained = masks is not None or bool(waits)
        inputs = (
            decode_rows(samplers, self.scheduler.tables)
            if decode_only and not batch.drafts
            else seq_inputs(entries, sampling, batch.drafts)
        )
        # plain greedy rows (the common case) need no sampler's row: only their argmax; the
        # others are their own (a Request is a SampledRow), marked for the step alone
        plain = not constrained and all([req.plain for req in samplers])
        rows = [] if plain else samplers
        self._marked = unmark(self._marked)  # the last launch's masks and drafts
        if batch.drafts and rows:  # a drafted row's last position follows all its drafts
            self._marked = mark_drafts(samplers, batch.drafts)
        # a greedy step without grammar masks needs only each row's argmax: the model's
        # head may take it without writing the logits (ModelRunner.execute)
        argmax = bool(samplers) and (plain or not constrained and self.sampler.argmax_only(rows))
        in_flight = self._in_flight.sample if self._in_flight is not None else None
        verify: dict[str, tuple[list[int], list[int]]] = {}
        sampled_verify: SampledVerify | None = None
        backend = self.runner.backend
        backend.prev_tokens = in_flight.token_ids if in_flight is not None else None
        backend.chained = self._in_flight is not None
        if isinstance(inputs, list) and any(s.prompt_logits for s in inputs):
            vocab = self.sampler.vocab_size if argmax else None
            logits, prompt_logits = self.runner.execute_with_prompt_logits(inputs, vocab)
            if batch.drafts:  # sampled rows' first (spec/sampled.py), then greedy ones
                self.counters.verify_steps += 1
                sampled_verify = sample_drafts(self.sampler, entries, prompt_logits, batch.drafts)
                isa = self.sampler.kernel_isa
                targets = draft_targets(
                    entries, prompt_logits, batch.drafts, self.vocab_size, spec_masks, isa
                )
                verify = {r: (batch.drafts[r], t) for r, t in targets.items()}
            keep_prompt_logprobs(entries, prompt_logits, self.vocab_size)
        else:
            logits = self.runner.execute(inputs, self.sampler.vocab_size if argmax else None)
        t2 = time.perf_counter()
        if waits:  # the tokens in flight read (kept for their resolve), matchers advanced
            pending = self._in_flight
            assert pending is not None and pending.sample is not None  # it sampled them
            pending.host = pending.sample.result(kept=True)
            self.grammars.advance_ahead(waits, pending.host.token_ids)
            masks = self.grammars.start(samplers, spec_masks, at_once=True)  # nothing else now
        masked = mark_masks(rows, self.grammars.wait(masks), self._marked)
        sample: DeviceSample | None
        if not samplers:
            sample = None
        elif logits.dtype == torch.long:  # the tokens themselves
            sample = DeviceSample(logits)
        elif plain:
            sample = self.sampler.greedy(logits)
        else:
            prev = in_flight.token_ids if in_flight is not None else None
            sample = self.sampler.sample(logits, rows, True, prev, masked) if rows else None
        if sample is not None:
            sample.start_copy()
        stats.forward += t2 - t1
        stats.sample += time.perf_counter() - t2
        self.counters.prompt_tokens += batch.num_prefill_tokens
        sampled = self.scheduler.advance(batch, sampling) if advance else []
        return InFlight(sampled, sample, verify, sampled_verify)

    def _resolve(
        self,
        step: InFlight,
        stats: StepStats,
        outputs: OutputColumns,
        launched: InFlight | None = None,
        fused: Fused | None = None,
    ) -> None:
        """The step's tokens on the host (waiting if need be) into its requests, into `outputs`
        an output each still running or just finished; `launched`'s rows advance if `fused`."""
        t0 = time.perf_counter()
        result = step.host  # read already (_launch, for grammar rows' masks)
        if result is None and step.sample is not None:
            result = step.sample.result(kept=True)
        stats.sample += time.perf_counter() - t0
        self.counters.num_steps += 1
        if result is None:  # no row sampled (prompt chunks only)
            return
        grammars = self.grammars if self.grammars.matchers else None  # none: no row has one
        drafts: dict = step.drafts
        if step.sampled_drafts is not None:
            drafts = {**drafts, **step.sampled_drafts.targets()}
        other = partial(self._resolve_row, drafts, grammars)
        tokens, lps, before = result.token_ids, result.logprobs, len(outputs)
        if launched is not None and fused is not None:
            resolve_and_advance(
                self.scheduler, step.sampled, tokens, lps, other, outputs, launched.sampled, fused
            )
        else:
            resolve_rows(self.scheduler, step.sampled, tokens, lps, drafts, other, outputs)
        self.counters.generation_tokens += len(outputs) - before

    def _resolve_row(
        self,
        drafts: dict,
        grammars: GrammarMatchers | None,
        req: Request,
        index: int,
        token: int,
        lp: TokenLogprobs | RowLogprobs | None,
    ) -> RequestOutput | None:
        """A row resolve_rows leaves to the engine: finished, drafted, apart, a stop or last."""
        lp = token_logprobs(lp)  # its lists (result(kept=True) gave a RowLogprobs)
        if req.status.finished:  # aborted, or stopped at its previous token:
            self.scheduler.resolve(req, index, token)  # nothing more to send
            return None
        if drafts and req.request_id in drafts:  # the drafts it accepts, and one more
            sched, row_drafts = self.scheduler, drafts[req.request_id]
            out = verified_output(
                sched, self.grammars, self.counters, req, index, token, lp, *row_drafts
            )
        else:
            self.scheduler.resolve(req, index, token)
            if grammars is not None and grammars.advanced(req, token) and not req.status.finished:
                self.scheduler.finish_at(req, index, RequestStatus.FINISHED_STOPPED)  # complete
            out = last_output(req, token, lp)
        if self.grammars.refused and (error := self.grammars.refusal(req)) is not None:
            self._fail(req, error, 400)  # its grammar broke: no stop, an error
            return None
        if req.status.finished:
            del self.requests[req.request_id]
            self.grammars.drop(req.request_id)
        return out

    generate = run_to_end  # offline: prompts (token ids) run to completion, their outputs
