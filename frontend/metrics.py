"""Prometheus metrics with vLLM-style names under the `zeroserve:` prefix.

Engine gauges are the sums over the scheduler replicas' latest EngineStatus (a replica that
left counts no more), and each replica has its own series under `zeroserve:replica_*`
with an `engine` label (its id, as vLLM's engine label): waiting, running, KV usage,
prefix-cache hits, up. The prompt and generation token counters carry that label too
(vLLM's `prompt_tokens_total{engine="0"}`): the replica that stepped, as the outputs say
(TextOutputs.replica), not the frontend's routing. The prefix-cache counters advance by the
difference between consecutive cumulative values of each replica, carried on its step
outputs (TextOutputs.prefix_cache: in order, as they happen, not a heartbeat later). Latencies are measured
here, from the HTTP request's arrival to the moment the frontend inbox received an
output: TTFT, inter-token latency (per token: a step of k tokens gives k observations of
dt/k; the first step only feeds TTFT), end-to-end. Stage times (tokenize, queue,
prefill, decode, detokenize) come from the wall-clock stamps the workers attach to every
finished request (`timings`); stamps from one host share one clock, across hosts they
are as good as the clock sync (the frontend's own latencies above are skew-free).
The scheduler's busy split (forward, sample, schedule, ipc; on a GPU also "device", the
forwards' own time on the device) mirrors EngineStatus.busy.
`recent_tokens` counts output tokens as they arrive, for the live tokens/s of GET /stats.

Each app owns its own CollectorRegistry, so several apps can live in one process (tests).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from common.messages import EngineStatus
from frontend.metric_table import METRICS, P
from frontend.request_handle import RequestHandle

RATE_WINDOW_S = 5.0  # the window of the live output tokens/s


class RateWindow:
    """Events per second over the last `window_s`: (time, count) pairs, oldest first;
    pairs older than the window are dropped as new ones come and when the rate is read."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._sum = 0

    def _prune(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._sum -= self._events.popleft()[1]

    def add(self, now: float, count: int) -> None:
        self._events.append((now, count))
        self._sum += count
        self._prune(now)

    def rate(self, now: float) -> float:
        self._prune(now)
        return self._sum / self.window_s


def stage_durations(t: dict[str, Any]) -> dict[str, float]:
    """Durations (seconds) between the wall-clock stamps the workers put in `timings`;
    a stage whose stamps are missing or out of order is left out."""

    def span(start: str, end: str) -> float | None:
        a, b = t.get(start), t.get(end)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and 0 <= b - a < 1e6:
            return float(b - a)
        return None

    out = {
        "tokenize_s": span("arrival_time", "tokenized_time"),
        "queue_s": span("arrival_time", "first_scheduled_time"),
        "scheduler_queue_s": span("scheduler_received_time", "first_scheduled_time"),
        "prefill_s": span("first_scheduled_time", "first_token_time"),
        "decode_s": span("first_token_time", "finished_time"),
        "detok_s": t.get("detok_time_s") if isinstance(t.get("detok_time_s"), float) else None,
        "e2e_s": span("arrival_time", "detok_sent_time"),
    }
    return {k: v for k, v in out.items() if v is not None}


def shown_timings(timings: dict[str, Any] | None) -> dict[str, float] | None:
    """The stage durations in ms for the client (usage.timings; the caller asks only for
    a request that set return_timings)."""
    if timings is None:
        return None
    return {
        k.removesuffix("_s") + "_ms": round(v * 1e3, 3) for k, v in stage_durations(timings).items()
    }


class Metrics:
    """The metrics of one app, on its own registry: one attribute per row of
    frontend/metric_table.py (METRICS), annotated here for the type checker."""

    num_running: Gauge
    num_waiting: Gauge
    kv_usage: Gauge
    kv_free_blocks: Gauge
    kv_total_blocks: Gauge
    in_flight: Gauge
    prefix_queries: Counter
    prefix_hits: Counter
    prompt_tokens: Counter
    generation_tokens: Counter
    request_success: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    tokenize_time: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    detok_time: Histogram
    busy: Counter
    replica_running: Gauge
    replica_waiting: Gauge
    replica_kv_usage: Gauge
    replica_prefix_hits: Gauge
    replica_weight_bytes: Gauge
    replica_memory: Gauge
    replica_up: Gauge

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        for s in METRICS:  # in table order, the order /metrics shows them
            m: Counter | Gauge | Histogram
            if s.kind is Histogram:
                m = Histogram(P + s.name, s.doc, s.labels, registry=r, buckets=s.buckets)
            else:
                m = s.kind(P + s.name, s.doc, s.labels, registry=r)
            setattr(self, s.attr, m)
        self._engines: dict[int, EngineStatus] = {}  # replica -> latest status (counted)
        self._last_busy: dict[tuple[int, str], float] = {}
        self.recent_tokens = RateWindow(RATE_WINDOW_S)  # output tokens, for GET /stats
        self.replica_tokens: dict[int, RateWindow] = {}  # the same, per replica
        self.replica_tokens_total: dict[int, int] = {}
        self._last_prefix: dict[int, tuple[int, int]] = {}  # replica -> (queries, hits)

    def on_engine_status(self, msg: EngineStatus) -> None:
        k = msg.replica
        self._engines[k] = msg
        self._set_totals()
        engine = str(k)
        self.replica_running.labels(engine=engine).set(msg.num_running)
        self.replica_waiting.labels(engine=engine).set(msg.num_waiting)
        self.replica_kv_usage.labels(engine=engine).set(msg.kv_usage)
        self.replica_prefix_hits.labels(engine=engine).set(msg.prefix_cache_hits)
        self.replica_up.labels(engine=engine).set(1)
        self.replica_weight_bytes.labels(engine=engine).set(msg.weight_bytes)
        for part, value in (msg.memory or {}).items():
            if part.endswith("_bytes") and isinstance(value, (int, float)) and len(part) <= 40:
                self.replica_memory.labels(engine=engine, part=part.removesuffix("_bytes")).set(
                    value
                )
        self.prompt_tokens.labels(engine=engine)  # a replica in shows its counters, at 0
        self.generation_tokens.labels(engine=engine)
        for part, total in (msg.busy or {}).items():
            if not isinstance(total, (int, float)) or not 0 <= total < 1e12 or len(part) > 32:
                continue
            d = total - self._last_busy.get((k, part), 0.0)
            self.busy.labels(part=part).inc(d if d >= 0 else total)  # restarted scheduler
            self._last_busy[(k, part)] = total

    def on_prefix_cache(self, replica: int, queries: int, hits: int) -> None:
        """A replica's cumulative prefix-cache counters, from its step outputs (in order);
        a smaller value means it restarted from zero."""
        last_q, last_h = self._last_prefix.get(replica, (0, 0))
        if (queries, hits) == (last_q, last_h):
            return
        dq, dh = queries - last_q, hits - last_h
        self.prefix_queries.inc(dq if dq >= 0 and dh >= 0 else queries)
        self.prefix_hits.inc(dh if dq >= 0 and dh >= 0 else hits)
        self._last_prefix[replica] = (queries, hits)

    def replica_down(self, replica: int) -> None:
        """A replica left: it counts in the totals no more (until its next status)."""
        if self._engines.pop(replica, None) is not None:
            self._set_totals()
        self.replica_up.labels(engine=str(replica)).set(0)
        self.replica_running.labels(engine=str(replica)).set(0)
        self.replica_waiting.labels(engine=str(replica)).set(0)

    def _set_totals(self) -> None:
        es = self._engines.values()
        free, total = sum(e.num_free_blocks for e in es), sum(e.num_total_blocks for e in es)
        self.num_running.set(sum(e.num_running for e in es))
        self.num_waiting.set(sum(e.num_waiting for e in es))
        used = sum(e.kv_usage * e.num_total_blocks for e in es)
        self.kv_usage.set(used / total if total else 0.0)
        self.kv_free_blocks.set(free)
        self.kv_total_blocks.set(total)

    def on_output(
        self,
        handle: RequestHandle,
        index: int,
        num_prompt_tokens: int,
        num_output_tokens: int,
        finish: str | None,
        timings: dict[str, Any] | None,
        now: float,
        replica: int,
    ) -> None:
        """An output of sub-request `index` of `handle`, stepped by `replica`, reached the
        frontend at `now`. The handle keeps each sub-request's progress (first / last token
        time, token counts) for these latencies, and for the tokens an abort counts
        (on_aborted)."""
        num_new = num_output_tokens - handle.num_output_tokens[index]
        if num_new > 0:
            self.replica_tokens.setdefault(replica, RateWindow(RATE_WINDOW_S)).add(now, num_new)
            self.replica_tokens_total[replica] = self.replica_tokens_total.get(replica, 0) + num_new
            self.on_tokens(
                now,
                handle.arrival,
                handle.first_token_at[index],
                handle.last_token_at[index],
                num_new,
            )
            if handle.first_token_at[index] is None:
                handle.first_token_at[index] = now
            handle.last_token_at[index] = now
            handle.num_output_tokens[index] = num_output_tokens
        handle.num_prompt_tokens[index] = num_prompt_tokens
        if finish is not None:
            self.on_finished(
                finish, now - handle.arrival, num_prompt_tokens, num_output_tokens, timings, replica
            )

    def on_tokens(
        self, now: float, arrival: float, first_at: float | None, last_at: float, num_new: int
    ) -> None:
        """num_new tokens of one sub-request arrived at `now`."""
        self.recent_tokens.add(now, num_new)
        if first_at is None:
            self.ttft.observe(now - arrival)  # tokens of the first step have no gap before them
        elif num_new > 0:
            gap = (now - last_at) / num_new
            for _ in range(num_new):
                self.itl.observe(gap)

    def on_finished(
        self,
        reason: str,
        e2e_s: float,
        num_prompt_tokens: int,
        num_output_tokens: int,
        timings: dict[str, Any] | None,
        replica: int = 0,
    ) -> None:
        self.request_success.labels(finished_reason=reason).inc()
        self.e2e.observe(e2e_s)
        self.prompt_tokens.labels(engine=str(replica)).inc(num_prompt_tokens)
        self.generation_tokens.labels(engine=str(replica)).inc(num_output_tokens)
        if timings:
            stages = stage_durations(timings)
            for name, hist in (
                ("queue_s", self.queue_time),
                ("tokenize_s", self.tokenize_time),
                ("prefill_s", self.prefill_time),
                ("decode_s", self.decode_time),
                ("detok_s", self.detok_time),
            ):
                v = stages.get(name)
                if v is not None:
                    hist.observe(v)

    def on_aborted(
        self, replica: int, num_prompt_tokens: int = 0, num_output_tokens: int = 0
    ) -> None:
        """A sub-request the frontend aborted (disconnect, timeout, failed component) on
        `replica`: its later outputs are dropped; the tokens it got so far count like a
        finished one's."""
        self.request_success.labels(finished_reason="abort").inc()
        self.prompt_tokens.labels(engine=str(replica)).inc(num_prompt_tokens)
        self.generation_tokens.labels(engine=str(replica)).inc(num_output_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
