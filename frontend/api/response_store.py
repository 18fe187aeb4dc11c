"""Stored responses of /v1/responses, for `previous_response_id` and GET / DELETE.

One SQLite table (the standard library's sqlite3), bounded in count and in bytes
(server.responses_store_max, server.responses_store_bytes); the oldest responses are
dropped first. With one frontend it lives in the process's memory; with several
(config.api_servers > 1) in one file in the run dir that they all open
(frontend.frontends.responses_db), so a follow-up call finds the response whichever
frontend it reaches. Each change is one transaction (BEGIN IMMEDIATE: the writers take
turns), so the invariant holds for every reader: count <= max_count and the sum of the
entries' sizes <= max_bytes. A response larger than max_bytes on its own is not kept.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUSY_TIMEOUT_S = 5.0  # another frontend's write in progress: wait this long at most

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order they were kept: oldest dropped first
    id TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL,  -- JSON [response, input_items]
    size INTEGER NOT NULL
)
"""


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as the API returned it
    input_items: list[dict[str, Any]]  # the whole conversation before it (previous ones too)
    num_bytes: int


class ResponseStore:
    def __init__(self, max_count: int, max_bytes: int, path: str | Path | None = None) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.db = sqlite3.connect(
            ":memory:" if path is None else str(path),
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,  # transactions are spelled out below
            check_same_thread=False,  # the event loop's thread only, but tests may differ
        )
        if path is not None:
            self.db.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
            self.db.execute("PRAGMA synchronous=OFF")  # a cache: a power cut may lose it
        self.db.execute(_SCHEMA)

    def __len__(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def __contains__(self, response_id: str) -> bool:
        row = self.db.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,))
        return row.fetchone() is not None

    @property
    def num_bytes(self) -> int:
        return self.db.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]

    def put(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> bool:
        """Keep `response` (and the items it answered); False when it alone is too big."""
        body = json.dumps([response, input_items], separators=(",", ":"))
        size = len(body.encode())
        with self._transaction() as db:
            db.execute("DELETE FROM responses WHERE id = ?", (response["id"],))
            if size > self.max_bytes or self.max_count < 1:
                return False
            db.execute(
                "INSERT INTO responses (id, body, size) VALUES (?, ?, ?)",
                (response["id"], body, size),
            )
            count, total = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses"
            ).fetchone()
            while count > self.max_count or total > self.max_bytes:
                seq, dropped = db.execute(
                    "SELECT seq, size FROM responses ORDER BY seq LIMIT 1"
                ).fetchone()
                db.execute("DELETE FROM responses WHERE seq = ?", (seq,))
                count, total = count - 1, total - dropped
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        row = self.db.execute(
            "SELECT body, size FROM responses WHERE id = ?", (response_id,)
        ).fetchone()
        if row is None:
            return None
        response, input_items = json.loads(row[0])
        return StoredResponse(response, input_items, row[1])

    def delete(self, response_id: str) -> bool:
        with self._transaction() as db:
            return db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def _transaction(self) -> _Transaction:
        return _Transaction(self.db)

    def close(self) -> None:
        self.db.close()

    def check_integrity(self) -> None:
        assert len(self) <= self.max_count
        sizes = [r[0] for r in self.db.execute("SELECT size FROM responses")]
        assert self.num_bytes == sum(sizes) <= self.max_bytes


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on an exception): one writer at a time."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_exc) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
