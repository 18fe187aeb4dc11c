"""GET /v1/responses/{id}/input_items: the whole conversation a stored response answered,
paged as OpenAI pages it (newest first by default, `after` an item id, `limit` 1-100), and
a chain over a response with reasoning (fake backend: see fake_backend.py)."""

from __future__ import annotations

import pytest

from tests.frontend.conftest import serve

pytestmark = pytest.mark.timeout(30)


def _items(http, response_id: str, **params) -> dict:
    r = http.get(f"/v1/responses/{response_id}/input_items", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_input_items_list_the_conversation_newest_first(http):
    first = http.post("/v1/responses", json={"input": "Hi"}).json()
    body = {
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "More"}]},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"},
        ],
        "previous_response_id": first["id"],
    }
    second = http.post("/v1/responses", json=body).json()
    page = _items(http, second["id"], order="asc")
    assert page["object"] == "list" and page["has_more"] is False
    data = page["data"]
    assert [i["type"] for i in data] == ["message", "message", "message", "function_call_output"]
    assert data[0]["content"] == [{"type": "input_text", "text": "Hi"}]  # a string input
    assert data[1] == first["output"][0]  # the previous response's answer, as it was
    assert data[2]["content"] == [{"type": "input_text", "text": "More"}]
    assert data[3]["call_id"] == "call_1" and data[3]["output"] == "42"
    ids = [i["id"] for i in data]
    assert len(set(ids)) == 4 and ids[0].startswith("msg_") and ids[3].startswith("fco_")
    assert (page["first_id"], page["last_id"]) == (ids[0], ids[-1])
    newest_first = _items(http, second["id"])  # order desc by default
    assert [i["id"] for i in newest_first["data"]] == ids[::-1]
    assert _items(http, second["id"], order="asc") == page  # the ids stay put


def test_input_items_pages_by_after_and_limit(http):
    resp = http.post(
        "/v1/responses", json={"input": [{"role": "user", "content": f"m{i}"} for i in range(5)]}
    ).json()
    pages, after = [], None
    while True:
        params = {"order": "asc", "limit": 2, **({"after": after} if after else {})}
        page = _items(http, resp["id"], **params)
        pages.append([i["content"][0]["text"] for i in page["data"]])
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert pages == [["m0", "m1"], ["m2", "m3"], ["m4"]]


@pytest.mark.parametrize(
    "params, param",
    [
        ({"limit": 0}, "limit"),
        ({"limit": 101}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"after": "msg_nope"}, "after"),
        ({"include": "message.input_image.image_url"}, "include"),
    ],
)
def test_input_items_bad_query_is_a_400_naming_it(http, params, param):
    resp = http.post("/v1/responses", json={"input": "Hi"}).json()
    r = http.get(f"/v1/responses/{resp['id']}/input_items", params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_input_items_of_an_unknown_or_unstored_response_is_a_404(http):
    assert http.get("/v1/responses/resp_nope/input_items").status_code == 404
    unkept = http.post("/v1/responses", json={"input": "Hi", "store": False}).json()
    r = http.get(f"/v1/responses/{unkept['id']}/input_items")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_a_chain_over_a_response_with_reasoning():
    """A previous response's reasoning item is listed with its conversation but is not
    shown to the model again: the next turn sees the answer only."""
    with serve(reasoning_parser="qwen3") as s, s.client() as http:
        first = http.post("/v1/responses", json={"input": "think"}).json()
        assert [i["type"] for i in first["output"]] == ["reasoning", "message"]
        r = http.post("/v1/responses", json={"input": "And?", "previous_response_id": first["id"]})
        assert r.status_code == 200, r.text
        with s.backend.lock:
            messages = s.backend.requests[-1].messages
        assert [m["role"] for m in messages] == ["user", "assistant", "user"]
        assert messages[1]["content"] == first["output"][1]["content"][0]["text"]
        listed = _items(http, r.json()["id"], order="asc")["data"]
        assert [i["type"] for i in listed] == ["message", "reasoning", "message", "message"]
