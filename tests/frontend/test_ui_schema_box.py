"""The web page's JSON-schema box (frontend/static/index.html): its `schemaFormat`
function run by node on sample boxes. The browser test (tests/e2e/test_ui_browser.py)
checks the page sends it; this one runs wherever node is."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "frontend" / "static" / "index.html"


def _run(box: str) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the page's script")
    m = re.search(r"^function schemaFormat\(text\) \{.*?^\}$", PAGE.read_text(), re.S | re.M)
    assert m, "schemaFormat not found in the page"
    script = (
        m.group(0)
        + "\ntry { console.log(JSON.stringify({ok: schemaFormat("
        + json.dumps(box)
        + ")})); }"
        + "\ncatch (e) { console.log(JSON.stringify({error: e.message, name: e.name})); }"
    )
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_empty_box_sends_no_response_format():
    assert _run("") == {"ok": None}
    assert _run("  \n ") == {"ok": None}


def test_a_schema_becomes_response_format_json_schema():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    assert _run(json.dumps(schema, indent=2)) == {
        "ok": {
            "type": "json_schema",
            "json_schema": {"name": "page_schema", "schema": schema, "strict": True},
        }
    }


@pytest.mark.parametrize(
    "box, words",
    [('{"type": "object",', "not valid JSON"), ("[1, 2]", "JSON object"), ("null", "JSON object")],
)
def test_invalid_boxes_are_errors_not_requests(box, words):
    out = _run(box)
    assert out["name"] == "SyntaxError" and words in out["error"], out
