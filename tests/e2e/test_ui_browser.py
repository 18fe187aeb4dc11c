"""The web page in a real browser: headless Chromium (Debian's chromium + chromium-driver,
driven by selenium) against the real server (launch.py, the default model).

Skipped, with a one-line reason, where no Chromium or chromedriver is installed; nothing
is downloaded (the driver's path is given, so selenium-manager never runs). A screenshot
of the page is left in test-artifacts/ (git-ignored) and its path printed.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import REPO

pytestmark = pytest.mark.timeout(300)

ARTIFACTS = REPO / "test-artifacts"
ABORTED = 'zeroserve:request_success_total{finished_reason="abort"}'


def _find(*names: str) -> str | None:
    return next((p for p in map(shutil.which, names) if p), None)


@pytest.fixture(scope="module")
def browser() -> Iterator:
    chromium = _find("chromium", "chromium-browser", "google-chrome")
    driver_path = _find("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("no chromium/chromedriver (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def page(browser, server):
    browser.get(server.url + "/")
    return browser


def _text(driver, css: str) -> str:
    return driver.execute_script(
        "const e = document.querySelectorAll(arguments[0]); "
        "return e.length ? e[e.length - 1].textContent : '';",
        css,
    )


def _set(driver, element_id: str, value: str) -> None:
    el = driver.find_element("id", element_id)
    el.clear()
    el.send_keys(value)


def _wait(predicate, timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _stats(server) -> dict:
    return httpx.get(server.url + "/stats", timeout=5).json()["totals"]


def test_a_chat_reply_streams_in_in_several_increments(page):
    _set(page, "temperature", "0")
    _set(page, "max_tokens", "40")
    _set(page, "prompt", "Tell me a short story about a cat.\n")  # Enter sends
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # poll the DOM while it streams
        text = _text(page, ".msg.assistant")
        if text and (not seen or text != seen[-1]):
            seen.append(text)
        if not page.find_element("id", "stop").is_enabled() and seen:
            break
        time.sleep(0.01)
    final = _text(page, ".msg.assistant")
    assert "finish:" in final, final  # the usage note: the stream ended normally
    assert len(seen) >= 3, seen  # text arrived piece by piece, each a prefix of the next
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:])), seen
    assert _text(page, ".msg.user") == "Tell me a short story about a cat."
    assert page.find_element("id", "prompt").get_attribute("value") == ""


def test_stop_aborts_the_request_in_the_scheduler(page, server):
    aborted_before = server.metrics().get(ABORTED, 0.0)
    page.find_element("id", "ignore_eos").click()
    _set(page, "max_tokens", "2000")  # minutes of decoding unless it is really aborted
    _set(page, "prompt", "Count from one to a thousand.")
    page.find_element("id", "send").click()
    _wait(lambda: len(_text(page, ".msg.assistant")) > 40, 60, "the reply to stream")
    _wait(lambda: _stats(server)["num_requests_running"] == 1, 10, "the scheduler to run it")
    # the panel shows the live figures (it refreshes every second)
    _wait(lambda: _text(page, "#stat-running") == "1", 5, "the panel to show it running")
    _wait(lambda: float(_text(page, "#stat-tps")) > 0, 5, "the panel's tokens/s")

    page.find_element("id", "stop").click()
    _wait(lambda: "stopped" in _text(page, ".msg.assistant"), 5, "the page to stop")
    stopped_len = len(_text(page, ".msg.assistant"))
    _wait(
        lambda: _stats(server)["num_requests_running"] == 0,
        10,
        "the scheduler to abort it",
        every_s=0.2,
    )
    server.wait_idle()  # and every KV block is free again
    assert server.metrics().get(ABORTED, 0.0) == aborted_before + 1
    _wait(lambda: _text(page, "#stat-running") == "0", 5, "the panel to show nothing running")
    assert int(_text(page, "#stat-total")) > 0
    assert len(_text(page, ".msg.assistant")) == stopped_len  # nothing arrived after Stop

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "ui-playground.png"
    assert page.save_screenshot(str(shot)), shot
    print(f"screenshot of the web page: {shot}")
    assert Path(shot).stat().st_size > 10_000


def test_the_engine_panel_lists_each_replica_when_there_are_several(browser, page):
    """One replica: no per-replica table. With --dp 2 the panel gets one row per replica,
    each shown up, and the totals count both (the page after /stats' "replicas")."""
    from tests.e2e.conftest import start_server

    assert page.find_element("id", "replicas").get_attribute("hidden") is not None
    server = start_server("--dp", "2", workers=1)
    try:
        browser.get(server.url + "/")
        rows = _wait(
            lambda: browser.execute_script(
                "const t = document.getElementById('replicas');"
                "return t.hidden ? null : [...t.tBodies[0].rows].map("
                "  (r) => [...r.cells].map((c) => c.textContent));"
            ),
            20,
            "the per-replica table",
        )
        assert [r[:2] for r in rows] == [["0", "up"], ["1", "up"]], rows
        assert [r[-1] for r in rows] == ["cpu", "cpu"], rows  # the device column
        assert _wait(lambda: _text(browser, "#stat-running") == "0", 5, "the totals")
        ARTIFACTS.mkdir(exist_ok=True)
        assert browser.save_screenshot(str(ARTIFACTS / "ui-replicas.png"))
    finally:
        assert server.stop() == 0, server.log()[-3000:]


def test_the_json_schema_box_is_sent_as_response_format(page):
    """Invalid JSON in the box: an error on the page and no request; a schema: the chat
    request carries it as response_format json_schema (whether this build serves it is
    the server's answer, not the page's)."""
    page.execute_script(
        "window.__sent = [];"
        "const f = window.fetch;"
        "window.fetch = (url, opts) => {"
        "  if (opts && opts.method === 'POST') window.__sent.push([url, JSON.parse(opts.body)]);"
        "  return f(url, opts); };"
    )
    if page.find_element("id", "ignore_eos").is_selected():
        page.find_element("id", "ignore_eos").click()
    _set(page, "max_tokens", "8")
    _set(page, "json_schema", '{"type": "object",')
    _wait(lambda: page.find_element("id", "json_schema_error").is_displayed(), 5, "the error")
    assert "not valid JSON" in _text(page, "#json_schema_error")
    _set(page, "prompt", "Hello")
    page.find_element("id", "send").click()
    time.sleep(0.5)
    assert page.execute_script("return window.__sent.length") == 0
    assert page.find_element("id", "prompt").get_attribute("value") == "Hello"  # kept

    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    _set(page, "json_schema", json.dumps(schema))
    _wait(lambda: not page.find_element("id", "json_schema_error").is_displayed(), 5, "no error")
    page.find_element("id", "send").click()
    sent = _wait(lambda: page.execute_script("return window.__sent"), 10, "the request")
    url, body = sent[0]
    assert url == "/v1/chat/completions"
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "page_schema", "schema": schema, "strict": True},
    }
    _wait(lambda: not page.find_element("id", "stop").is_enabled(), 60, "the reply to end")
    _set(page, "json_schema", "")  # later requests free again
