"""deploy/grafana/zeroserve.json: every query names a metric the server exports (with the
suffix Prometheus gives its type) and groups only by labels that metric has."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from frontend.metrics import Metrics
from tests.frontend.test_metrics import status

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "zeroserve.json"
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus to every series


def exported() -> dict[str, set[str]]:
    """Sample name -> its labels, as /metrics serves them once the server has seen an
    engine heartbeat and a finished request (labelled series appear with their first value)."""
    m = Metrics()
    m.on_engine_status(status())
    m.on_finished("stop", 0.5, 3, 2, {"arrival_time": 1.0, "tokenized_time": 1.1})
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


def test_every_query_names_an_exported_metric_and_its_labels():
    metrics = exported()
    assert (
        "zeroserve:generation_tokens_total" in metrics
        and "zeroserve:request_success_total" in metrics
    )
    seen = set()
    for title, expr in queries():
        names = re.findall(r"zeroserve:[A-Za-z0-9_:]+", expr)
        assert names, f"{title}: {expr!r} names no zeroserve metric"
        for name in names:
            assert name in metrics, f"{title}: {name} is not exported (exported: {sorted(metrics)})"
            seen.add(name)
        grouped = {g.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for g in by.split(",")}
        allowed = set().union(*(metrics[n] for n in names)) | SCRAPE_LABELS
        assert grouped <= allowed, f"{title}: groups by {grouped - allowed}, not labels of {names}"
        assert expr.count("(") == expr.count(")"), f"{title}: unbalanced parentheses"
    # the panels: throughput, TTFT / inter-token / end-to-end percentiles, queue,
    # KV usage, prefix-cache hits
    for name in (
        "generation_tokens_total",
        "time_to_first_token_seconds_bucket",
        "inter_token_latency_seconds_bucket",
        "e2e_request_latency_seconds_bucket",
        "num_requests_waiting",
        "num_requests_running",
        "kv_cache_usage_perc",
        "prefix_cache_hits_total",
    ):
        assert f"zeroserve:{name}" in seen, name


def test_dashboard_is_importable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "zeroserve"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "instance"} <= names
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
