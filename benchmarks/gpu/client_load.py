"""The GPU check's checks under load (client.py's `structured` and `fault` commands):
structured outputs and a tool call on the GPU, and kill -9 of the scheduler under streams."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import httpx
from client_util import alive, dump, log, post

# the string is bounded (maxLength), so that the grammar itself brings the JSON to its end:
# random weights never choose a closing quote, and an unbounded string ran to max_tokens,
# which proves only a valid prefix; within the bound the reply must end, and end valid
CITY_MAX = 12
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": CITY_MAX}},
    "required": ["city"],
}


def chat(c: httpx.Client, url: str, body: dict) -> tuple[dict, float]:
    t = time.perf_counter()
    r = c.post(url + "/v1/chat/completions", json=body)
    dt = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
    return r.json(), dt


def healthy(c: httpx.Client, url: str, timeout: float) -> float:
    """Wait (up to timeout) for /health 200; the seconds waited."""
    t = time.time()
    while time.time() - t < timeout:
        with contextlib.suppress(httpx.HTTPError):
            if c.get(url + "/health").status_code == 200:
                break
        time.sleep(0.2)
    return round(time.time() - t, 2)


def structured(url: str, out: str) -> int:
    """With random weights the text is junk, but the grammar must keep it valid: the
    content parses as the schema's JSON, the tool call's arguments parse. A reply cut at
    max_tokens (finish_reason "length") may be unfinished: then once more with 256 tokens,
    and the verdict says which."""
    res: dict = {}
    ok = True
    with httpx.Client(timeout=120.0, trust_env=False) as c:
        model = c.get(url + "/v1/models").json()["data"][0]["id"]
        msgs = [{"role": "user", "content": "Which city is the capital of France? JSON."}]
        for name in ("json_schema", "tool_required"):
            entry: dict = {}
            healthy(c, url, 30.0)  # each request on its own (a crash before restarts)
            for max_tokens in (64, 256):
                body: dict = {"model": model, "messages": msgs, "max_tokens": max_tokens}
                body["temperature"] = 0
                if name == "json_schema":
                    body["response_format"] = {
                        "type": "json_schema",
                        "json_schema": {"name": "city", "schema": CITY_SCHEMA},
                    }
                else:
                    body["tools"] = [
                        {
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "description": "The weather in a city",
                                "parameters": CITY_SCHEMA,
                            },
                        }
                    ]
                    body["tool_choice"] = "required"
                try:
                    r, dt = chat(c, url, body)
                    ch = r["choices"][0]
                    msg = ch.get("message") or {}
                    entry = {
                        "max_tokens": max_tokens,
                        "finish_reason": ch.get("finish_reason"),
                        "seconds": round(dt, 3),
                        "usage": r.get("usage"),
                    }
                    if name == "json_schema":
                        text = msg.get("content") or ""
                        entry["content"] = text[:400]
                    else:
                        calls = msg.get("tool_calls") or []
                        entry["tool_calls"] = len(calls)
                        text = calls[0]["function"]["arguments"] if calls else ""
                        entry["function"] = calls[0]["function"].get("name") if calls else None
                        entry["arguments"] = text[:400]
                    try:
                        obj = json.loads(text)
                        entry["parses"] = True
                        city = obj.get("city") if isinstance(obj, dict) else None
                        entry["schema_ok"] = (
                            isinstance(city, str) and len(city) <= CITY_MAX and set(obj) == {"city"}
                        )
                    except ValueError as e:
                        entry["parses"] = False
                        entry["parse_error"] = str(e)[:200]
                except Exception as e:  # noqa: BLE001 - report, go on
                    entry = {"max_tokens": max_tokens, "error": f"{type(e).__name__}: {e}"[:400]}
                res.setdefault(name + "_tries", []).append(entry)
                log(f"{name} max_tokens {max_tokens}: {entry}")
                if entry.get("parses") or entry.get("finish_reason") != "length":
                    break
            if entry.get("parses") and entry.get("schema_ok"):
                verdict = "PASS"
            elif entry.get("error"):
                verdict = "ERROR"
            elif entry.get("finish_reason") == "length":
                verdict = "INCONCLUSIVE (cut at max_tokens, unfinished)"
            else:
                verdict = "FAIL"
            if name == "tool_required" and entry.get("parses") and entry.get("finish_reason"):
                entry["finish_reason_is_tool_calls"] = entry["finish_reason"] == "tool_calls"
            res[name] = verdict
            ok = ok and verdict == "PASS"
    dump(res, out)
    return 0 if ok else 1


def scheduler_pids(launch_pid: int) -> list[int]:
    """launch.py's children running scheduler_worker (from /proc)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as f:
                ppid = next(int(ln.split()[1]) for ln in f if ln.startswith("PPid:"))
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except (OSError, StopIteration, ValueError):
            continue
        if ppid == launch_pid and b"scheduler_worker" in cmd and alive(int(d)):
            pids.append(int(d))
    return sorted(pids)


def fault(url: str, launch_pid: int, out: str, streams: int, tokens: int) -> int:
    """kill -9 the scheduler while `streams` streams of `tokens` tokens are running."""
    import threading

    res: dict = {"streams": streams, "tokens": tokens}
    with httpx.Client(timeout=10.0, trust_env=False) as c:
        res["healthy_before_s"] = healthy(c, url, 30.0)  # a restart after an earlier failure
        model = c.get(url + "/v1/models").json()["data"][0]["id"]
    t_kill: list[float] = []
    state = [{"chunks": 0, "end": None, "how": None} for _ in range(streams)]

    def run(i: int) -> None:
        st = state[i]
        body = {"model": model, "prompt": f"Stream {i}: once upon a time", "stream": True}
        body |= {"max_tokens": tokens, "temperature": 0, "ignore_eos": True}
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0), trust_env=False) as cl,
                cl.stream("POST", url + "/v1/completions", json=body) as s,
            ):
                if s.status_code != 200:
                    st["how"] = f"HTTP {s.status_code}"
                    return
                for line in s.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        st["how"] = st["how"] or "done"
                        continue
                    d = json.loads(line[6:])
                    if "error" in d:
                        st["how"] = "error event"
                        st["error"] = str(d["error"])[:200]
                    else:
                        st["chunks"] += 1
                st["how"] = st["how"] or "closed"
        except Exception as e:  # noqa: BLE001
            st["how"] = f"exception {type(e).__name__}"
        finally:
            st["end"] = time.time()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    t0 = time.time()
    # kill as soon as every stream is under way (or over, or 30 s): a fixed wait after that
    # let a GPU finish all 16 x 256 tokens before the kill in the first run
    while time.time() - t0 < 30 and any(st["chunks"] < 4 and st["end"] is None for st in state):
        time.sleep(0.01)
    res["streams_started"] = sum(st["chunks"] > 0 for st in state)
    res["streams_over_before_kill"] = sum(st["end"] is not None for st in state)
    res["chunks_before_kill"] = sum(st["chunks"] for st in state)
    pids = scheduler_pids(launch_pid)
    res["scheduler_pids"] = pids
    if not pids:
        res["verdict"] = "FAIL: no scheduler process found under launch.py"
        dump(res, out)
        return 1
    t_kill.append(time.time())
    os.kill(pids[0], signal.SIGKILL)
    log(f"kill -9 scheduler pid {pids[0]} with {res['streams_started']} streams under way")
    for t in threads:
        t.join(timeout=max(0.0, t_kill[0] + 20 - time.time()))
    ends = [st["end"] - t_kill[0] for st in state if st["end"] is not None]
    res["streams_ended"] = len(ends)
    after = [e for e in ends if e >= 0]
    res["streams_ended_max_s"] = round(max(after), 2) if after else None
    res["stream_endings"] = {}
    for st in state:
        res["stream_endings"][st["how"] or "still open"] = (
            res["stream_endings"].get(st["how"] or "still open", 0) + 1
        )
    res["completed_all_tokens"] = sum(st["how"] == "done" for st in state)
    res["errors_sample"] = [st["error"] for st in state if st.get("error")][:2]
    log(f"streams: {res['stream_endings']} (last ended {res['streams_ended_max_s']}s after kill)")
    # /health: down (503) at some point, then 200 again with a new scheduler
    down = back = None
    new_pids: list[int] = []
    with httpx.Client(timeout=2.0, trust_env=False) as c:
        while time.time() - t_kill[0] < 60:
            try:
                code = c.get(url + "/health").status_code
            except httpx.HTTPError:
                code = 0
            now = time.time() - t_kill[0]
            new_pids = [p for p in scheduler_pids(launch_pid) if p != pids[0]]
            if code != 200 and down is None:
                down = now
            if code == 200 and new_pids and (down is not None or now > 15):
                back = now
                break
            time.sleep(0.1)
        res["health_down_seen_s"] = round(down, 2) if down is not None else None
        res["health_back_s"] = round(back, 2) if back is not None else None
        res["new_scheduler_pids"] = new_pids
        log(f"/health: down at {down}, back at {back}; new scheduler pids {new_pids}")
    with httpx.Client(timeout=60.0, trust_env=False) as c:
        try:
            t = time.perf_counter()
            r = post(c, url, {"model": model, "prompt": "After the restart,", "max_tokens": 8})
            res["after_request_s"] = round(time.perf_counter() - t, 2)
            res["after_request_ok"] = bool(r["choices"][0].get("text") is not None)
            res["after_request_tokens"] = (r.get("usage") or {}).get("completion_tokens")
        except Exception as e:  # noqa: BLE001
            res["after_request_ok"] = False
            res["after_request_error"] = str(e)[:300]
        log(f"request after restart: ok {res['after_request_ok']}")
    open_streams = streams - len(ends)
    if res["streams_started"] == 0:
        res["verdict"] = f"FAIL: no stream was under way at the kill ({res['stream_endings']})"
    elif res["streams_over_before_kill"] == streams:
        res["verdict"] = "INCONCLUSIVE: every stream was over before the kill (more --tokens)"
    elif open_streams:
        res["verdict"] = f"FAIL: {open_streams} stream(s) still open 20 s after the kill"
    elif back is None:
        res["verdict"] = "FAIL: /health not back to 200 with a new scheduler within 60 s" + (
            "" if new_pids else " (launch.py started no new scheduler)"
        )
    elif not res["after_request_ok"]:
        res["verdict"] = "FAIL: the request after the restart was not served"
    else:
        res["verdict"] = "PASS"
    log(f"fault check: {res['verdict']}")
    dump(res, out)
    return 0 if res["verdict"] == "PASS" else 1
