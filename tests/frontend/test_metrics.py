"""frontend/metric_table.py: every row of METRICS is exported by a fresh Metrics (its name,
type, help text, labels and buckets, in table order, and nothing beside the table), as the
attribute the row names, and Metrics' annotations (for the type checker) match the table."""

from __future__ import annotations

import math
import typing

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frontend.metric_table import METRICS, P
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
        collector = getattr(m, s.attr)
        assert type(collector) is s.kind, s
        assert collector in m.registry._collector_to_names, s  # on this app's registry


def test_every_row_exports_its_labels_and_buckets():
    m = Metrics()
    for s in METRICS:
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
    assert kinds == {s.attr: s.kind for s in METRICS}
