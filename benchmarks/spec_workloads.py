"""The `agent` and `extract` workloads of bench_spec.py (issue 53), from benchmarks/data/.

agent    spec_agent.json: an order-support agent's tool loop, three sessions of four
         turns; request i is a session's conversation so far (system prompt with the
         tools, the task, the earlier calls and their JSON results, replayed from the
         trace) and asks for the next call. Run in order, one after another: the later
         sessions' calls repeat the earlier ones' JSON, which a store of recent outputs
         (`suffix`) can draft and the request's own prompt cannot
extract  spec_extract.json: a document and a question answered by quoting it
edit-lookup  a rename in a source file (edit_inventory.py.txt), the reply the whole file
         (bench_spec.py's `edit` gives the file as the prediction too)
"""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data"
EDIT_FILE = DATA / "edit_inventory.py.txt"
# (what to rename, its new name): one thing each, in the file's first 256 tokens or so
RENAMES = [("load_items", "read_items"), ("save_items", "store_items"), ("total", "subtotal")]


def agent_messages() -> list[list[dict]]:
    """The agent workload's requests, in the order they run: a session's turns in turn."""
    trace = json.loads((DATA / "spec_agent.json").read_text())
    out = []
    for session in trace["sessions"]:
        messages = [
            {"role": "system", "content": trace["system"]},
            {"role": "user", "content": session["task"]},
        ]
        for call, result in session["turns"]:
            out.append(list(messages))
            messages += [
                {"role": "assistant", "content": call},
                {"role": "tool", "content": result},
            ]
    return out


def extract_messages() -> list[list[dict]]:
    items = json.loads((DATA / "spec_extract.json").read_text())["items"]
    return [
        [
            {
                "role": "user",
                "content": f"Document:\n\n{it['document']}\n\nQuestion: {it['question']}",
            }
        ]
        for it in items
    ]


def edit_asks(with_prediction: bool) -> list[tuple[str, str | None]]:
    """(the user's message, the file as its prediction or None) a rename."""
    source = EDIT_FILE.read_text()
    return [
        (
            f"Rename `{old}` to `{new}` everywhere in this Python file. Reply with the whole "
            f"updated file and nothing else.\n\n```python\n{source}```",
            source if with_prediction else None,
        )
        for old, new in RENAMES
    ]


def edit_lookup_messages() -> list[list[dict]]:
    return [[{"role": "user", "content": ask}] for ask, _ in edit_asks(False)]


WORKLOADS = {
    "agent": agent_messages,
    "extract": extract_messages,
    "edit-lookup": edit_lookup_messages,
}
