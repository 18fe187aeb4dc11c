"""The web page at / and GET /stats over plain HTTP (no browser; the browser test is
tests/e2e/test_ui_browser.py), against the real app and the fake backend."""

from __future__ import annotations

import argparse
import fnmatch
import re
from pathlib import Path

import pytest

from common.cli import add_config_args, config_from_args
from frontend.ui import PAGE
from tests.frontend.conftest import serve
from tests.frontend.fake_backend import DEVICE, GPUS

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
REPLICA_KEYS = {
    "id",
    "model",
    "alive",
    "status_age_s",
    "device",
    "gpus",
    "num_requests_running",
    "num_requests_waiting",
    "num_requests_in_flight",
    "kv_cache_usage",
    "kv_cache_free_blocks",
    "kv_cache_total_blocks",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "prefix_cache_hit_rate",
    "output_tokens_per_s",
    "output_tokens_total",
    "spec_method",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_acceptance_rate",
}
TOTALS_KEYS = {
    "num_requests_running",
    "num_requests_waiting",
    "num_requests_in_flight",
    "kv_cache_free_blocks",
    "kv_cache_total_blocks",
    "kv_cache_usage",
    "output_tokens_per_s",
    "output_tokens_total",
    "prefix_cache_hit_rate",
    "spec_acceptance_rate",
    "num_replicas",
    "num_replicas_alive",
}


def test_the_page_is_served_and_loads_nothing_from_elsewhere(http):
    r = http.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "<title>zeroserve</title>" in r.text
    assert not re.search(r"https?://", r.text, re.IGNORECASE)  # no CDN, font or remote script
    assert "//" not in " ".join(re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", r.text))
    # and the browser is told so: only inline script/style, fetches to this origin
    csp = r.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    for path in ("/v1/chat/completions", "/v1/completions", "/stats"):
        assert path in r.text


def test_stats_has_the_documented_shape_and_counts_output_tokens(served, http):
    r = http.get("/stats")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"time", "replicas", "totals"}
    (replica,) = body["replicas"]
    assert set(replica) == REPLICA_KEYS and set(body["totals"]) == TOTALS_KEYS
    # the fake backend's heartbeat: 30 of 40 blocks free, 40 of 100 prefix tokens hit
    assert replica["alive"] is True and replica["model"] == served.config.model_name
    assert replica["kv_cache_usage"] == 0.25 and body["totals"]["kv_cache_usage"] == 0.25
    assert replica["prefix_cache_hit_rate"] == 0.4 == body["totals"]["prefix_cache_hit_rate"]
    assert body["totals"]["num_replicas"] == body["totals"]["num_replicas_alive"] == 1
    assert (replica["device"], replica["gpus"]) == (DEVICE, GPUS)  # its GPU, named
    assert replica["spec_acceptance_rate"] is None  # no speculative decoding there
    before = replica["output_tokens_total"]

    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3})
    assert r.status_code == 200, r.text
    num_out = r.json()["usage"]["completion_tokens"]
    t = http.get("/stats").json()["totals"]
    assert t["output_tokens_total"] == before + num_out
    assert t["output_tokens_per_s"] > 0  # those tokens arrived within the window


def test_the_rate_window_forgets_old_tokens():
    from frontend.metrics import RateWindow

    w = RateWindow(5.0)
    w.add(100.0, 10)
    w.add(102.0, 5)
    assert w.rate(102.0) == 3.0
    assert w.rate(105.5) == 1.0  # the first 10 left the window
    assert w.rate(200.0) == 0.0


def test_with_an_api_key_stats_and_the_page_stay_open():
    with serve(api_key="sekrit") as s, s.client() as c:
        assert c.get("/v1/models").status_code == 401
        assert c.get("/").status_code == 200
        assert c.get("/stats").status_code == 200
        ok = c.get("/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert ok.status_code == 200


def test_no_ui_makes_the_page_a_404():
    with serve(ui=False) as s, s.client() as c:
        r = c.get("/")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert c.get("/stats").status_code == 200
        assert c.get("/health").status_code == 200


def test_the_no_ui_flag_sets_the_config():
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    assert config_from_args(parser.parse_args([])).server.ui is True
    assert config_from_args(parser.parse_args(["--no-ui"])).server.ui is False


def test_the_page_is_package_data():
    """An installed (non-editable) package must carry the page: pyproject's package-data
    globs for `frontend` have to match it."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
    (globs,) = re.findall(r"^frontend\s*=\s*\[(.*?)\]", section, re.MULTILINE)
    rel = PAGE.relative_to(REPO / "frontend").as_posix()
    assert any(fnmatch.fnmatch(rel, g.strip().strip('"')) for g in globs.split(","))
    assert PAGE.stat().st_size < 32 * 1024  # small and readable
