"""/v1/responses' store: previous_response_id prepends the conversation, GET and DELETE,
"store": false, and the store's bounds (count and bytes, oldest first)."""

from __future__ import annotations

import pytest

from frontend.api.response_store import ResponseStore
from tests.frontend.conftest import last_request, serve

pytestmark = pytest.mark.timeout(30)


def test_previous_response_id_prepends_the_conversation(served, http):
    first = http.post("/v1/responses", json={"input": "Hi", "instructions": "Only here."}).json()
    second = http.post(
        "/v1/responses", json={"input": "More", "previous_response_id": first["id"]}
    ).json()
    assert second["previous_response_id"] == first["id"]
    assert last_request(served).messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello world!"},
        {"role": "user", "content": "More"},
    ]
    http.post("/v1/responses", json={"input": "Again", "previous_response_id": second["id"]})
    assert [m["content"] for m in last_request(served).messages] == [
        "Hi",
        "Hello world!",
        "More",
        "Hello world!",
        "Again",
    ]


def test_retrieve_delete_and_store_false(http):
    body = http.post("/v1/responses", json={"input": "Hi"}).json()
    assert http.get(f"/v1/responses/{body['id']}").json() == body
    r = http.delete(f"/v1/responses/{body['id']}")
    assert r.json() == {"id": body["id"], "object": "response.deleted", "deleted": True}
    assert http.get(f"/v1/responses/{body['id']}").status_code == 404
    assert http.delete(f"/v1/responses/{body['id']}").status_code == 404
    unkept = http.post("/v1/responses", json={"input": "Hi", "store": False}).json()
    assert unkept["store"] is False
    r = http.get(f"/v1/responses/{unkept['id']}")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = http.post("/v1/responses", json={"input": "x", "previous_response_id": unkept["id"]})
    assert r.status_code == 404


def test_store_bounds_count_and_bytes_oldest_first():
    def response(i: int, size: int = 10) -> dict:
        return {"id": f"resp_{i}", "output": ["x" * size]}

    store = ResponseStore(max_count=3, max_bytes=10_000)
    for i in range(5):
        assert store.put(response(i), [])
        store.check_integrity()
    assert len(store) == 3 and "resp_0" not in store and "resp_1" not in store and "resp_4" in store
    store = ResponseStore(max_count=100, max_bytes=1_000)
    for i in range(5):
        store.put(response(i, 300), [{"type": "message", "role": "user", "content": "hi"}])
        store.check_integrity()
    assert [i for i in range(5) if f"resp_{i}" in store] == [3, 4]  # 2 × ~350 bytes fit
    assert not store.put(response(9, 2_000), [])  # bigger than the whole store: not kept
    assert "resp_9" not in store and len(store) == 2
    store.check_integrity()
    assert store.delete("resp_3") and not store.delete("resp_3")
    store.check_integrity()


def test_store_bound_applies_to_the_server():
    with serve(responses_store_max=2) as s, s.client() as http:
        ids = [http.post("/v1/responses", json={"input": "Hi"}).json()["id"] for _ in range(3)]
        assert [http.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]
