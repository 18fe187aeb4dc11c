"""frontend/metric_table.py: every row of METRICS is exported by a fresh Metrics (its name,
type, help text, labels and buckets, in table order, and nothing beside the table): a
per-request row as the attribute the row names (Metrics' annotations, for the type checker,
match those rows), a FROM_ENGINE row from the replicas' statuses (EngineSeries)."""

from __future__ import annotations

import math
import typing

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from common.messages import EngineStatus
from frontend.metric_table import FROM_ENGINE, METRICS, P
from frontend.metrics import Metrics


def families(m: Metrics) -> dict:
    """Name -> family, as /metrics serves them (less the `_created` gauges the text format
    gives an unlabelled counter or histogram)."""
    text = generate_latest(m.registry).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    created = {n + "_created" for n, f in fams.items() if f.type in ("counter", "histogram")}
    return {n: f for n, f in fams.items() if n not in created}


def test_table_rows_are_well_formed():
    assert len({s.attr for s in METRICS}) == len(METRICS)
    assert len({s.name for s in METRICS}) == len(METRICS)
    for s in METRICS:
        assert s.kind in (Counter, Gauge, Histogram), s
        assert bool(s.buckets) == (s.kind is Histogram), s
        assert list(s.buckets) == sorted(s.buckets), s


def test_every_row_is_exported_by_a_fresh_metrics():
    m = Metrics()
    fams = families(m)
    assert list(fams) == [P + s.name for s in METRICS]  # table order, nothing else
    for s in METRICS:
        f = fams[P + s.name]
        assert f.type == s.kind.__name__.lower(), s
        assert f.documentation == s.doc, s
        if s.attr in FROM_ENGINE:
            assert not hasattr(m, s.attr), s
            continue
        collector = getattr(m, s.attr)
        assert type(collector) is s.kind, s
        assert collector in m.own._collector_to_names, s  # on this app's registry


def status(replica: int = 0, busy: float = 1.5, gpus: list[str] | None = None) -> EngineStatus:
    return EngineStatus(
        kind="heartbeat",
        num_running=3,
        num_waiting=2,
        kv_usage=0.25,
        num_free_blocks=30,
        num_total_blocks=40,
        prefix_cache_queries=10,
        prefix_cache_hits=4,
        model="m",
        max_model_len=64,
        vocab_size=100,
        time=0.0,
        busy={"forward": busy},
        replica=replica,
        memory={"resident_bytes": 1000},
        device="NVIDIA H200" if gpus is None or gpus else "cpu",
        gpus=[str(2 + replica)] if gpus is None else gpus,
        spec={"verify_steps": 7, "switched_off_steps": 2, "resolved_first_steps": 3},
        spec_method="ngram",
    )


def test_every_row_exports_its_labels_and_buckets():
    m = Metrics()
    m.on_engine_status(status())
    m.on_prefix_cache(0, 10, 4)
    for s in METRICS:
        if s.attr in FROM_ENGINE:
            continue
        collector = getattr(m, s.attr)
        if s.labels:
            collector = collector.labels(*("x" for _ in s.labels))
        if s.kind is Histogram:
            collector.observe(0.0)
        else:
            collector.inc()
    fams = families(m)
    for s in METRICS:
        samples = fams[P + s.name].samples
        assert samples, s
        for sample in samples:
            assert set(sample.labels) - {"le"} == set(s.labels), (s, sample)
        if s.kind is Histogram:
            bounds = [float(x.labels["le"]) for x in samples if x.name.endswith("_bucket")]
            assert bounds == [*s.buckets, math.inf], s


def test_metrics_annotations_match_the_table():
    hints = typing.get_type_hints(Metrics)
    kinds = {a: t for a, t in hints.items() if t in (Counter, Gauge, Histogram)}
    assert kinds == {s.attr: s.kind for s in METRICS if s.attr not in FROM_ENGINE}


def value(m: Metrics, name: str, **labels: str) -> float:
    fams = families(m)
    family = name.removesuffix("_total")
    for sample in fams[P + family].samples:
        if sample.name == P + name and sample.labels == labels:
            return sample.value
    raise KeyError(name, labels)


def test_engine_series_sum_replicas_and_survive_restarts():
    m = Metrics()
    m.on_engine_status(status(0, busy=1.5))
    m.on_engine_status(status(1, busy=2.0))
    assert value(m, "num_requests_running") == 6
    assert value(m, "kv_cache_usage_perc") == 0.25
    assert value(m, "scheduler_busy_seconds_total", part="forward") == 3.5
    m.on_engine_status(status(0, busy=2.5))  # +1 s on replica 0
    m.on_engine_status(status(1, busy=0.5))  # replica 1 restarted: its 0.5 s are new
    assert value(m, "scheduler_busy_seconds_total", part="forward") == 5.0
    m.on_prefix_cache(0, 10, 4)
    m.on_prefix_cache(0, 30, 14)
    m.on_prefix_cache(0, 5, 1)  # restarted
    assert value(m, "prefix_cache_queries_total") == 35
    assert value(m, "prefix_cache_hits_total") == 15
    m.replica_down(1)
    assert value(m, "num_requests_running") == 3  # replica 1 counts no more
    assert value(m, "replica_up", engine="1") == 0
    assert value(m, "replica_num_requests_running", engine="1") == 0
    assert value(m, "replica_up", engine="0") == 1
    assert value(m, "scheduler_memory_bytes", engine="0", part="resident") == 1000


def test_each_replica_names_its_device_and_gpus_and_keeps_them_while_down():
    m = Metrics()
    m.on_engine_status(status(0))  # launch.py's --gpu-ids 2,3 placement
    m.on_engine_status(status(1))
    m.on_engine_status(status(2, gpus=[]))  # one on a CPU
    m.on_engine_status(status(3, gpus=["0", "1"]))  # one spanning two GPUs
    info = {
        s.labels["engine"]: (s.labels["device"], s.labels["gpus"], s.value)
        for s in families(m)[P + "replica_device_info"].samples
    }
    assert info == {
        "0": ("NVIDIA H200", "2", 1),
        "1": ("NVIDIA H200", "3", 1),
        "2": ("cpu", "", 1),
        "3": ("NVIDIA H200", "0,1", 1),
    }
    m.replica_down(1)  # where it ran is still named (replica_up says it is down)
    assert value(m, "replica_device_info", engine="1", device="NVIDIA H200", gpus="3") == 1


def test_speculative_steps_by_replica_method_and_kind():
    m = Metrics()
    m.on_engine_status(status(0))
    m.on_engine_status(status(1))
    assert value(m, "spec_decode_num_steps_total", engine="1", method="ngram", kind="verify") == 7
    kind = "switched_off"
    assert value(m, "spec_decode_num_steps_total", engine="0", method="ngram", kind=kind) == 2
    kind = "resolved_first"
    assert value(m, "spec_decode_num_steps_total", engine="1", method="ngram", kind=kind) == 3
