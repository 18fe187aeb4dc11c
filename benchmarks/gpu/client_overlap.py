"""The GPU check's options under overlapped scheduling (client.py's `overlap` command), on
a served model (random weights: the checks are about the engine, not the text):

    seeded     a seeded request (temperature 0.8, top_p 0.9) gives the same text alone and
               among `others` concurrent requests of the chat mix
    stop       a stop string taken from the greedy text ends the reply right before it
    n          n = 3 with a seed: three choices, each as long as asked
    grammar    a json_schema request among the others: its content parses

Preemption under a small KV pool needs a server of its own (--num-kv-blocks): not here.
"""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
from client_load import CITY_SCHEMA, chat
from client_util import dump, log

PROMPT = "Write a short story about a lighthouse keeper."


def stop_string(greedy: str) -> str:
    """4 characters of the greedy text from its middle on, the first with a non-space (a
    random-weight model's text can be whitespace there); any 4 where it has none."""
    mid = len(greedy) // 2
    for start in (*range(mid, len(greedy) - 3), *range(0, mid)):
        if greedy[start : start + 4].strip():
            return greedy[start : start + 4]
    return greedy[mid : mid + 4]


def overlap(url: str, out: str, others: int = 127, tokens: int = 48) -> int:
    res: dict = {}
    with httpx.Client(timeout=180.0, trust_env=False) as c:
        model = c.get(url + "/v1/models").json()["data"][0]["id"]

        def body(**kw) -> dict:
            b = {"model": model, "messages": [{"role": "user", "content": PROMPT}]}
            b.update({"max_tokens": tokens, "ignore_eos": True, **kw})
            return b

        seeded = body(temperature=0.8, top_p=0.9, seed=4242)
        schema = {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY_SCHEMA}}
        alone = chat(c, url, seeded)[0]["choices"][0]["message"]["content"]

        def other(i: int) -> dict:
            kw: dict = {"temperature": 0.7, "top_p": 0.9} if i % 4 else {"temperature": 0}
            if i % 8 == 3:
                kw["presence_penalty"] = 0.5
            if i == 5:
                kw.update(response_format=schema, ignore_eos=False)
            with httpx.Client(timeout=180.0, trust_env=False) as oc:
                return chat(oc, url, body(**kw))[0]

        with cf.ThreadPoolExecutor(max_workers=min(others + 1, 64)) as pool:
            crowd = [pool.submit(other, i) for i in range(others)]
            among = pool.submit(lambda: chat(c, url, seeded)[0])
            replies = [f.result() for f in crowd]
            crowded = among.result()["choices"][0]["message"]["content"]
        res["seeded"] = "PASS" if crowded == alone else "FAIL"
        res["seeded_texts"] = [alone[:200], crowded[:200]]
        content = replies[5]["choices"][0]["message"]["content"] if others > 5 else None
        try:
            res["grammar"] = "PASS" if content is None or json.loads(content) else "FAIL"
        except ValueError:
            res["grammar"] = f"FAIL: {content[:200]!r}"

        greedy = chat(c, url, body(temperature=0))[0]["choices"][0]["message"]["content"]
        cut = stop_string(greedy)
        stopped = chat(c, url, body(temperature=0, stop=[cut]))[0]["choices"][0]
        text = stopped["message"]["content"]
        ok = bool(cut) and greedy.startswith(text) and cut not in text
        res["stop"] = "PASS" if ok and stopped["finish_reason"] == "stop" else "FAIL"
        res["stop_detail"] = {"stop": cut, "text": text[-80:], "finish": stopped["finish_reason"]}

        many = chat(c, url, body(n=3, temperature=0.9, seed=7))[0]
        lens = [ch["finish_reason"] for ch in many["choices"]]
        n_ok = len(many["choices"]) == 3 and many["usage"]["completion_tokens"] == 3 * tokens
        res["n"] = "PASS" if n_ok else f"FAIL: {lens}, usage {many['usage']}"
    log(f"overlap checks: {res}")
    dump(res, out)
    return (
        0 if all(str(res[k]).startswith("PASS") for k in ("seeded", "grammar", "stop", "n")) else 1
    )
