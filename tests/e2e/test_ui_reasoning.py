"""The web page shows a reply's reasoning (--reasoning-parser) in a folded <details> above
its answer: headless Chromium (test_ui_browser's fixture) against the tiny random Qwen 3
of test_reasoning, served with --reasoning-parser qwen3.

The page has no box for a regex, so the test wraps the page's `fetch` to add
`structured_outputs` to the chat request's body (as test_ui_browser wraps it to read the
body): the output is forced into `<think>reasoning</think>ANSWER`, lower-case reasoning and
an upper-case answer, so neither can hide inside the other. Two requests in all: one
through the page, one plain (the server's own split, to compare with). A screenshot is
left in test-artifacts/ui-reasoning.png.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.e2e import test_reasoning, test_ui_browser
from tests.e2e.test_ui_browser import _set, _text, _wait

pytestmark = pytest.mark.timeout(300)

# the same module-scoped fixtures: a headless Chromium, and the tiny Qwen 3 served with
# --reasoning-parser qwen3 (assigned, not imported, so they stay fixtures of this module)
browser = test_ui_browser.browser
thinking_server = test_reasoning.thinking_server

REASONING, ANSWER = "[a-z]{4}[a-z ]{0,16}", "[A-Z ]{1,20}"
EXTRA = {"structured_outputs": {"regex": f"<think>{REASONING}</think>{ANSWER}"}}
PROMPT = "Hi"


@pytest.fixture(scope="module")
def page(browser, thinking_server):
    browser.get(thinking_server.url + "/")
    # every chat request gets EXTRA in its body; each snapshot of the reply the
    # MutationObserver sees while it streams is kept in window.__seen, and each change of
    # a <details>' `open` attribute in window.__toggles (its old value: '' was open, null closed)
    browser.execute_script(
        "const extra = arguments[0], f = window.fetch;"
        "window.fetch = (url, opts) => {"
        "  if (url === '/v1/chat/completions')"
        "    opts = { ...opts, body: JSON.stringify({ ...JSON.parse(opts.body), ...extra }) };"
        "  return f(url, opts); };"
        "window.__seen = []; window.__toggles = [];"
        "new MutationObserver((records) => {"
        "  for (const r of records)"
        "    if (r.attributeName === 'open') window.__toggles.push(r.oldValue);"
        "  const out = [...document.querySelectorAll('.msg.assistant')].pop();"
        "  const box = out && out.querySelector('details');"
        "  if (out) window.__seen.push({"
        "    reasoning: box ? box.lastChild.textContent : null, open: box ? box.open : null,"
        "    answer: out.querySelector('.answer').textContent });"
        "}).observe(document.getElementById('log'),"
        "           { childList: true, subtree: true, characterData: true, attributeOldValue: true });",
        EXTRA,
    )
    return browser


def test_a_replys_reasoning_is_folded_above_its_answer(page, thinking_server):
    body = {
        "model": httpx.get(thinking_server.url + "/v1/models").json()["data"][0]["id"],
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 60,
        "temperature": 0,
        **EXTRA,
    }
    r = httpx.post(thinking_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    reasoning, answer = message["reasoning_content"], message["content"]
    assert re.fullmatch(REASONING, reasoning) and re.fullmatch(ANSWER, answer), message

    _set(page, "temperature", "0")  # greedy: the page gets the same reply
    _set(page, "max_tokens", "60")
    _set(page, "prompt", PROMPT + "\n")  # Enter sends
    _wait(lambda: "finish:" in _text(page, ".msg.assistant"), 60, "the reply")
    reply = page.find_elements("css selector", ".msg.assistant")[-1]
    (box,) = reply.find_elements("css selector", "details")
    shown = page.execute_script(
        "const [out, box] = arguments;"
        "return { first: out.firstElementChild === box, open: box.open,"
        "  summary: box.querySelector('summary').textContent,"
        "  reasoning: box.lastChild.textContent,"
        "  answer: out.querySelector('.answer').textContent };",
        reply,
        box,
    )
    assert shown == {
        "first": True,  # at the top of the reply's bubble
        "open": False,  # folded
        "summary": "Reasoning",
        "reasoning": reasoning,  # the server's split, no tag
        "answer": answer,
    }, shown
    assert "think" not in shown["reasoning"] + shown["answer"]
    visible = reply.text  # what is rendered: the folded reasoning is not
    assert answer.strip() in visible and "Reasoning" in visible, visible
    assert reasoning.strip() not in visible, visible

    seen, toggles = page.execute_script("return [window.__seen, window.__toggles]")
    # streamed in: each snapshot's reasoning a prefix of the whole; shown open, folded
    # once (when the answer started: every snapshot with answer text has it folded)
    assert all(reasoning.startswith(s["reasoning"] or "") for s in seen), seen
    assert toggles == [""], toggles  # open -> closed, by the page
    assert all(s["open"] is False for s in seen if s["answer"]), seen

    test_ui_browser.ARTIFACTS.mkdir(exist_ok=True)
    assert page.save_screenshot(str(test_ui_browser.ARTIFACTS / "ui-reasoning.png"))

    box.find_element("css selector", "summary").click()  # and it unfolds
    assert page.execute_script("return arguments[0].open", box) is True
    assert reasoning.strip() in reply.text
