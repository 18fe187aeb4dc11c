"""The table of the frontend's Prometheus metrics: one row a metric, in the order /metrics
shows them, under the name `P + name` (a counter is exported with the `_total` suffix
Prometheus gives its type). The rows in FROM_ENGINE are the replicas' own figures, which
every frontend receives (frontend.metrics.EngineSeries exports them); `frontend.metrics.Metrics`
creates each other row's metric, measured per request, as the attribute the row names.
What each metric means: frontend/metrics.py."""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client import Counter, Gauge, Histogram

P = "zeroserve:"
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
)


class MetricSpec(NamedTuple):
    attr: str  # the attribute of Metrics
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str  # exported as P + name
    doc: str  # the HELP text
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds (+Inf added)


S = MetricSpec
METRICS: tuple[MetricSpec, ...] = (
    S("num_running", Gauge, "num_requests_running", "Requests running in the engine."),
    S("num_waiting", Gauge, "num_requests_waiting", "Requests waiting in the engine."),
    S("kv_usage", Gauge, "kv_cache_usage_perc", "KV-cache usage, 1 = full."),
    S("kv_free_blocks", Gauge, "kv_cache_free_blocks", "KV blocks held by no request."),
    S("kv_total_blocks", Gauge, "kv_cache_total_blocks", "KV blocks in the pool."),
    S(
        "in_flight",
        Gauge,
        "num_requests_in_flight",
        "Engine sub-requests the frontend is waiting on.",
    ),
    S("prefix_queries", Counter, "prefix_cache_queries", "Prefix-cache queries, in tokens."),
    S("prefix_hits", Counter, "prefix_cache_hits", "Prefix-cache hits, in tokens."),
    S("prompt_tokens", Counter, "prompt_tokens", "Prefill tokens processed.", ("engine",)),
    S("generation_tokens", Counter, "generation_tokens", "Tokens generated.", ("engine",)),
    S(
        "spec_draft_tokens",
        Counter,
        "spec_decode_num_draft_tokens",
        "Speculative decoding: tokens drafted.",
        ("engine",),
    ),
    S(
        "spec_accepted_tokens",
        Counter,
        "spec_decode_num_accepted_tokens",
        "Speculative decoding: drafted tokens accepted.",
        ("engine",),
    ),
    S(
        "preemptions",
        Counter,
        "num_preemptions",
        "Preemptions (a running request's KV dropped for want of blocks, recomputed later),"
        " counted when the request finishes.",
        ("engine",),
    ),
    S("request_success", Counter, "request_success", "Finished requests.", ("finished_reason",)),
    S("ttft", Histogram, "time_to_first_token_seconds", "Time to first token.", (), TTFT_BUCKETS),
    S("itl", Histogram, "inter_token_latency_seconds", "Inter-token latency.", (), ITL_BUCKETS),
    S(
        "e2e",
        Histogram,
        "e2e_request_latency_seconds",
        "End-to-end request latency.",
        (),
        E2E_BUCKETS,
    ),
    S(
        "queue_time",
        Histogram,
        "request_queue_time_seconds",
        "Time from arrival to first scheduling.",
        (),
        E2E_BUCKETS,
    ),
    S(
        "tokenize_time",
        Histogram,
        "request_tokenize_time_seconds",
        "From arrival to tokenized (frontend + tokenizer pool).",
        (),
        TTFT_BUCKETS,
    ),
    S(
        "prefill_time",
        Histogram,
        "request_prefill_time_seconds",
        "From first scheduled to first token.",
        (),
        E2E_BUCKETS,
    ),
    S(
        "decode_time",
        Histogram,
        "request_decode_time_seconds",
        "From first token to finished.",
        (),
        E2E_BUCKETS,
    ),
    S(
        "detok_time",
        Histogram,
        "request_detokenize_time_seconds",
        "Time the detokenizer spent on a request.",
        (),
        TTFT_BUCKETS,
    ),
    S(
        "busy",
        Counter,
        "scheduler_busy_seconds",
        "Scheduler busy time by part (forward, sample, schedule, ipc; on a GPU also device: "
        "the forwards' time on the device, a busy share beside the wall clock, and "
        "device_wait: the device's time between two overlapped forwards, waiting on the host).",
        ("part",),
    ),
    S(
        "replica_running",
        Gauge,
        "replica_num_requests_running",
        "Requests running in one scheduler replica.",
        ("engine",),
    ),
    S(
        "replica_waiting",
        Gauge,
        "replica_num_requests_waiting",
        "Requests waiting in one scheduler replica.",
        ("engine",),
    ),
    S(
        "replica_kv_usage",
        Gauge,
        "replica_kv_cache_usage_perc",
        "KV-cache usage of one scheduler replica, 1 = full.",
        ("engine",),
    ),
    S(
        "replica_prefix_hits",
        Gauge,
        "replica_prefix_cache_hits",
        "Prefix-cache hits of one scheduler replica since it started, in tokens.",
        ("engine",),
    ),
    S(
        "replica_weight_bytes",
        Gauge,
        "model_weight_bytes",
        "Bytes of model weights one scheduler replica holds (quantized blocks, file "
        "bytes and float tensors; the embedding, read from the file, not counted).",
        ("engine",),
    ),
    S(
        "replica_memory",
        Gauge,
        "scheduler_memory_bytes",
        "Where a scheduler replica's memory goes (scheduler_worker/memory_report.py): "
        "resident, kv_resident (KV pages touched so far), heap_in_use, heap_kept_free "
        "(freed heap pages still resident); "
        "on a GPU its plan too: gpu_total, weights, activation_peak, kv_pool, graphs.",
        ("engine", "part"),
    ),
    S("replica_up", Gauge, "replica_up", "1 while a scheduler replica serves.", ("engine",)),
    S(
        "replica_device",
        Gauge,
        "replica_device_info",
        "Where a scheduler replica runs, always 1: device (cpu, or its GPU's name) and gpus "
        "(its GPU ids as launch.py placed it, CUDA_VISIBLE_DEVICES; empty on a CPU).",
        ("engine", "device", "gpus"),
    ),
    S(
        "replica_spec_steps",
        Counter,
        "spec_decode_num_steps",
        "Speculative decoding steps by kind: verify (steps that verified drafts), "
        "switched_off (steps whose drafts the measured costs said would not pay) and "
        "resolved_first (overlapped scheduling: steps that waited for the step in flight "
        "so that their rows could draft).",
        ("engine", "method", "kind"),
    ),
)

# the rows exported from the replicas' statuses and step outputs (EngineSeries), not
# measured per request by the frontend that served it
FROM_ENGINE = frozenset(
    {
        "num_running",
        "num_waiting",
        "kv_usage",
        "kv_free_blocks",
        "kv_total_blocks",
        "prefix_queries",
        "prefix_hits",
        "busy",
        "replica_running",
        "replica_waiting",
        "replica_kv_usage",
        "replica_prefix_hits",
        "replica_weight_bytes",
        "replica_memory",
        "replica_up",
        "replica_device",
        "replica_spec_steps",
    }
)
