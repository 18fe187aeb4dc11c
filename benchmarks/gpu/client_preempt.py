"""The preemption check (issue 52, item 7), against a server whose KV pool is too small for
its load (launched with a few --num-kv-blocks):

    preempt    `streams` greedy chat requests at once, each `tokens` long (ignore_eos),
               distinct prompts (no prefix shared), their KV together past the pool, so
               the scheduler preempts the newest rows (recompute) and runs them again.
               Every request must end with all its tokens and no error; the server must
               have preempted (the requests' usage.timings.num_preemptions, and
               zeroserve:num_preemptions_total on /metrics); each text is compared with
               the one the same request gets alone, afterwards (greedy: equal, unless a
               kernel's result depends on the batch; `exact` makes any difference a
               failure: the float32 CPU server's case).
"""

from __future__ import annotations

import concurrent.futures as cf
import re

import httpx
from client_load import chat
from client_util import dump, log

TOPICS = ("a lighthouse", "a river", "a violin", "a mountain", "a library", "a comet")


def preemptions_total(c: httpx.Client, url: str) -> int:
    """zeroserve:num_preemptions_total summed over the replicas (0 before any)."""
    text = c.get(url + "/metrics").text
    counts = re.findall(r"^zeroserve:num_preemptions_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return int(sum(float(v) for v in counts))


def preempt(url: str, out: str, streams: int = 16, tokens: int = 256, exact: bool = False) -> int:
    res: dict = {}
    with httpx.Client(timeout=300.0, trust_env=False) as c:
        model = c.get(url + "/v1/models").json()["data"][0]["id"]

        def body(i: int) -> dict:
            topic = TOPICS[i % len(TOPICS)]
            prompt = f"Story {i}: tell me, at length, about {topic} and the people near it."
            return {
                "model": model,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "temperature": 0,
                "return_timings": True,
            }

        def one(i: int) -> dict:
            with httpx.Client(timeout=300.0, trust_env=False) as oc:
                return chat(oc, url, body(i))[0]

        before = preemptions_total(c, url)
        with cf.ThreadPoolExecutor(max_workers=streams) as pool:
            futures = [pool.submit(one, i) for i in range(streams)]
            crowd, errors = [], []
            for f in futures:
                try:
                    crowd.append(f.result())
                except Exception as e:  # an error is the check's answer, not the client's
                    errors.append(str(e)[:200])
                    crowd.append(None)
        served = [r for r in crowd if r is not None]
        lengths = [r["usage"]["completion_tokens"] for r in served]
        per_request = [(r["usage"].get("timings") or {}).get("num_preemptions", 0) for r in served]
        res["errors"] = errors
        res["all_tokens"] = len(served) == streams and all(n == tokens for n in lengths)
        res["preempted_requests"] = sum(n > 0 for n in per_request)
        res["preemptions"] = sum(per_request)
        res["metric_preemptions"] = preemptions_total(c, url) - before
        texts = [None if r is None else r["choices"][0]["message"]["content"] for r in crowd]
        alone = [
            chat(c, url, body(i))[0]["choices"][0]["message"]["content"] for i in range(streams)
        ]
        res["equal_alone"] = sum(t == a for t, a in zip(texts, alone))
        res["streams"], res["tokens"] = streams, tokens
        ok = not errors and res["all_tokens"] and res["preemptions"] > 0
        ok = ok and res["metric_preemptions"] == res["preemptions"]
        if exact:
            ok = ok and res["equal_alone"] == streams
        res["preempt"] = "PASS" if ok else "FAIL"
    log(f"preemption check: {res}")
    dump(res, out)
    return 0 if res["preempt"] == "PASS" else 1
