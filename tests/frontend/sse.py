"""Parse a Server-Sent Events body strictly: `data: <payload>\n\n` events only."""

from __future__ import annotations

import json


def parse_sse(body: str) -> list:
    """The events' payloads, JSON-decoded, with "[DONE]" kept as the string."""
    assert body.endswith("\n\n"), f"stream must end with a blank line: {body[-40:]!r}"
    events = []
    for block in body[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, f"bad SSE event {block!r}"
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events
