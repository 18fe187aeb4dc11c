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
forwards' own time on the device, and "device_wait", its time between two overlapped
forwards) mirrors EngineStatus.busy.
`recent_tokens` counts output tokens as they arrive, for the live tokens/s of GET /stats.

Each app owns its own CollectorRegistry, so several apps can live in one process (tests).
With several frontend processes on one port (config.api_servers), the per-request metrics
are summed over them (Metrics' multiprocess_dir) and the replicas' figures are each
frontend's own copy of what they all receive (EngineSeries).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from common.messages import EngineStatus
from frontend.metric_table import FROM_ENGINE, METRICS, P
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
    a request that set return_timings), its speculative decoding counts if it drafted, and
    how many times it was preempted if it was."""
    if timings is None:
        return None
    shown: dict[str, float] = {
        k.removesuffix("_s") + "_ms": round(v * 1e3, 3) for k, v in stage_durations(timings).items()
    }
    for key in ("num_draft_tokens", "num_accepted_tokens"):
        if isinstance(timings.get(key), int):
            shown[key] = timings[key]
    preemptions = timings.get("num_preemptions")
    if isinstance(preemptions, int) and preemptions > 0:
        shown["num_preemptions"] = preemptions
    return shown


class EngineSeries(Collector):
    """The FROM_ENGINE rows: the replicas' own figures, from their EngineStatus beats and
    the prefix-cache counters on their step outputs. Every frontend receives every status
    (FrontendLinks.broadcast), so each exports the same view of its own; with several
    frontends they are not summed. A custom collector (prometheus_client's Collector), so
    these series never go through the multiprocess files of the per-request ones."""

    def __init__(self) -> None:
        self.statuses: dict[int, EngineStatus] = {}  # replica -> latest status (counted)
        self.gauges: dict[int, dict[str, float]] = {}  # replica -> its replica_* values
        self.memory: dict[tuple[str, str], float] = {}  # (engine, part) -> bytes
        self.devices: dict[int, tuple[str, str]] = {}  # replica -> (device, gpus), kept
        self.spec: dict[tuple[str, str, str], float] = {}  # (engine, method, kind) -> steps
        self.busy: dict[str, float] = {}  # part -> seconds, summed over the replicas
        self._last_busy: dict[tuple[int, str], float] = {}
        self.prefix = [0, 0]  # queries, hits in tokens, summed over the replicas
        self._last_prefix: dict[int, tuple[int, int]] = {}  # replica -> (queries, hits)

    def on_status(self, msg: EngineStatus) -> None:
        k = msg.replica
        self.statuses[k] = msg
        self.gauges[k] = {
            "replica_running": msg.num_running,
            "replica_waiting": msg.num_waiting,
            "replica_kv_usage": msg.kv_usage,
            "replica_prefix_hits": msg.prefix_cache_hits,
            "replica_weight_bytes": msg.weight_bytes,
            "replica_up": 1,
        }
        if msg.device:  # kept while it is down: where it ran, and runs again on restart
            self.devices[k] = (msg.device[:100], ",".join(msg.gpus)[:200])
        engine = str(k)
        for kind in ("verify", "switched_off", "resolved_first"):
            steps = (msg.spec or {}).get(f"{kind}_steps")
            if msg.spec_method and isinstance(steps, (int, float)):
                self.spec[(engine, msg.spec_method[:32], kind)] = steps
        for part, value in (msg.memory or {}).items():
            if part.endswith("_bytes") and isinstance(value, (int, float)) and len(part) <= 40:
                self.memory[(engine, part.removesuffix("_bytes"))] = value
        for part, total in (msg.busy or {}).items():
            if not isinstance(total, (int, float)) or not 0 <= total < 1e12 or len(part) > 32:
                continue
            d = total - self._last_busy.get((k, part), 0.0)
            self.busy[part] = self.busy.get(part, 0.0) + (d if d >= 0 else total)  # restarted
            self._last_busy[(k, part)] = total

    def on_prefix_cache(self, replica: int, queries: int, hits: int) -> None:
        """A replica's cumulative prefix-cache counters, from its step outputs (in order);
        a smaller value means it restarted from zero."""
        last_q, last_h = self._last_prefix.get(replica, (0, 0))
        if (queries, hits) == (last_q, last_h):
            return
        dq, dh = queries - last_q, hits - last_h
        fresh = dq >= 0 and dh >= 0
        self.prefix[0] += dq if fresh else queries
        self.prefix[1] += dh if fresh else hits
        self._last_prefix[replica] = (queries, hits)

    def down(self, replica: int) -> None:
        """A replica left: it counts in the totals no more (until its next status)."""
        self.statuses.pop(replica, None)
        g = self.gauges.setdefault(replica, {})
        g.update(replica_up=0, replica_running=0, replica_waiting=0)

    def totals(self) -> dict[str, float]:
        es = self.statuses.values()
        free, total = sum(e.num_free_blocks for e in es), sum(e.num_total_blocks for e in es)
        used = sum(e.kv_usage * e.num_total_blocks for e in es)
        return {
            "num_running": sum(e.num_running for e in es),
            "num_waiting": sum(e.num_waiting for e in es),
            "kv_usage": used / total if total else 0.0,
            "kv_free_blocks": free,
            "kv_total_blocks": total,
        }

    def samples(self, attr: str) -> list[tuple[list[str], float]]:
        """One FROM_ENGINE row's (label values, value) pairs."""
        if attr in ("prefix_queries", "prefix_hits"):
            return [([], self.prefix[attr == "prefix_hits"])]
        if attr == "busy":
            return [([part], v) for part, v in self.busy.items()]
        if attr == "replica_memory":
            return [([engine, part], v) for (engine, part), v in self.memory.items()]
        if attr == "replica_spec_steps":
            return [(list(key), v) for key, v in self.spec.items()]
        if attr == "replica_device":
            return [([str(k), *where], 1) for k, where in self.devices.items()]
        if attr.startswith("replica_"):
            return [([str(k)], g[attr]) for k, g in self.gauges.items() if attr in g]
        return [([], self.totals()[attr])]

    def collect(self) -> Iterator[Metric]:
        for s in METRICS:
            if s.attr not in FROM_ENGINE:
                continue
            family = GaugeMetricFamily if s.kind is Gauge else CounterMetricFamily
            m = family(P + s.name, s.doc, labels=s.labels)
            for labels, value in self.samples(s.attr):
                m.add_metric(labels, value)
            yield m


class TableOrder(Collector):
    """The families of `sources`, in the table's order (METRICS)."""

    def __init__(self, *sources: Collector | CollectorRegistry) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        found = {m.name: m for source in self.sources for m in source.collect()}
        for s in METRICS:
            if (m := found.pop(P + s.name, None)) is not None:
                yield m
        yield from found.values()


class Metrics:
    """The metrics of one app: one attribute per row of frontend/metric_table.py measured
    per request (METRICS less FROM_ENGINE), annotated here for the type checker, and the
    replicas' own figures (`engine`, EngineSeries). `registry` is what /metrics renders.

    `multiprocess_dir`: several frontend processes (config.api_servers > 1) serve one
    port, each with the requests it accepted. Their per-request metrics are then
    prometheus_client's multiprocess files in that dir (PROMETHEUS_MULTIPROC_DIR, set
    before prometheus_client is imported: frontend/__main__.py), summed over the
    frontends by whichever one a scrape reaches; in_flight sums the live ones only."""

    in_flight: Gauge
    prompt_tokens: Counter
    generation_tokens: Counter
    spec_draft_tokens: Counter
    spec_accepted_tokens: Counter
    preemptions: Counter
    request_success: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    tokenize_time: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    detok_time: Histogram

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        own = CollectorRegistry()  # the per-request rows; rendered straight with one frontend
        for s in METRICS:  # in table order
            if s.attr in FROM_ENGINE:
                continue
            m: Counter | Gauge | Histogram
            if s.kind is Histogram:
                m = Histogram(P + s.name, s.doc, s.labels, registry=own, buckets=s.buckets)
            elif s.kind is Gauge:
                m = Gauge(P + s.name, s.doc, s.labels, registry=own, multiprocess_mode="livesum")
            else:
                m = s.kind(P + s.name, s.doc, s.labels, registry=own)
            setattr(self, s.attr, m)
        self.engine = EngineSeries()
        per_request: Collector | CollectorRegistry = own
        if multiprocess_dir is not None:
            per_request = CollectorRegistry()
            MultiProcessCollector(per_request, multiprocess_dir)
        self.own = own
        self.registry = CollectorRegistry()
        self.registry.register(TableOrder(per_request, self.engine))
        self.recent_tokens = RateWindow(RATE_WINDOW_S)  # output tokens, for GET /stats
        self.replica_tokens: dict[int, RateWindow] = {}  # the same, per replica
        self.replica_tokens_total: dict[int, int] = {}

    def on_engine_status(self, msg: EngineStatus) -> None:
        self.engine.on_status(msg)
        engine = str(msg.replica)
        self.prompt_tokens.labels(engine=engine)  # a replica in shows its counters, at 0
        self.generation_tokens.labels(engine=engine)

    def on_prefix_cache(self, replica: int, queries: int, hits: int) -> None:
        self.engine.on_prefix_cache(replica, queries, hits)

    def replica_down(self, replica: int) -> None:
        self.engine.down(replica)

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
        if timings and isinstance(timings.get("num_preemptions"), int):
            self.preemptions.labels(engine=str(replica)).inc(timings["num_preemptions"])
        if timings and timings.get("num_draft_tokens"):
            self.spec_draft_tokens.labels(engine=str(replica)).inc(timings["num_draft_tokens"])
            accepted = timings.get("num_accepted_tokens") or 0
            self.spec_accepted_tokens.labels(engine=str(replica)).inc(accepted)
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
