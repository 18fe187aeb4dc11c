"""Stored responses of /v1/responses, for `previous_response_id` and GET / DELETE.

In memory in the frontend process, bounded in count and in bytes (server.responses_store_max,
server.responses_store_bytes); the oldest responses are dropped first. Invariant after every
`put`: len(entries) <= max_count and num_bytes == the sum of the entries' sizes <= max_bytes.
A response larger than max_bytes on its own is not kept.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as the API returned it
    input_items: list[dict[str, Any]]  # the whole conversation before it (previous ones too)
    num_bytes: int


class ResponseStore:
    def __init__(self, max_count: int, max_bytes: int) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, response_id: str) -> bool:
        return response_id in self._entries

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> bool:
        """Keep `response` (and the items it answered); False when it alone is too big."""
        size = len(json.dumps([response, input_items], separators=(",", ":")).encode())
        self.delete(response["id"])
        if size > self.max_bytes or self.max_count < 1:
            return False
        self._entries[response["id"]] = StoredResponse(response, input_items, size)
        self.num_bytes += size
        while len(self._entries) > self.max_count or self.num_bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self.num_bytes -= dropped.num_bytes
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.num_bytes -= entry.num_bytes
        return True

    def check_integrity(self) -> None:
        assert len(self._entries) <= self.max_count
        assert self.num_bytes == sum(e.num_bytes for e in self._entries.values())
        assert self.num_bytes <= self.max_bytes
