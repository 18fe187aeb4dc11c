"""The HTTP side of the GPU check.

python client.py wait  URL PID TIMEOUT_S OUT.json [SPAWN_EPOCH]
    /health 200 (launch.py opens the port only when all are up); seconds from
    SPAWN_EPOCH (the driver's spawn time) when given, else from this call
python client.py check URL REF.json OUT.json
    prompt logprobs and greedy vs transformers (hf_ref.py's REF), the same prompts
    twice (prompt logprobs recomputed, then one token fresh and from the prefix cache)
python client.py structured URL OUT.json
    a response_format json_schema chat request and a tool_choice "required" request:
    does the output parse (JSON / the tool call's arguments)?
python client.py fault URL LAUNCH_PID OUT.json [--streams 16] [--tokens 4096]
    kill -9 the scheduler under streaming load: do the streams end, does /health come
    back (launch.py restarts a dead child), is the next request served?
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx


def dump(obj: dict, path: str) -> None:
    Path(path).write_text(json.dumps(obj, indent=1))


def log(msg: str) -> None:
    print(f"[client {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill 0: read its state
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait(url: str, pid: int, timeout: float, out: str, spawn: float | None = None) -> int:
    t0 = time.monotonic()
    # from the driver's spawn time (wall clock) when given: spawn -> /health 200
    since = (lambda: time.time() - spawn) if spawn else (lambda: time.monotonic() - t0)
    last = ""
    with httpx.Client(timeout=2.0, trust_env=False) as c:
        while time.monotonic() - t0 < timeout:
            if not alive(pid):
                log(f"server pid {pid} exited before /health answered 200 ({last})")
                dump({"ready": False, "why": "exited", "last": last}, out)
                return 3
            try:
                r = c.get(url + "/health")
                last = f"{r.status_code} {r.text[:300]}"
                if r.status_code == 200:
                    dt = since()
                    models = c.get(url + "/v1/models").json()
                    log(f"ready after {dt:.1f}s: {r.text[:300]}")
                    res = {"ready": True, "seconds": round(dt, 2), "health": r.json()}
                    res["models"] = models
                    dump(res, out)
                    return 0
            except httpx.HTTPError as e:
                last = type(e).__name__
            time.sleep(0.25)
    log(f"not ready after {timeout}s ({last})")
    dump({"ready": False, "why": "timeout", "last": last}, out)
    return 4


def post(c: httpx.Client, url: str, body: dict) -> dict:
    r = c.post(url + "/v1/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:500]}")
    return r.json()


def prefix_hits(c: httpx.Client, url: str) -> float | None:
    """zeroserve:prefix_cache_hits (tokens) from /metrics."""
    try:
        text = c.get(url + "/metrics").text
    except httpx.HTTPError:
        return None
    vals = [
        float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.split(" ", 1)[0].split("{", 1)[0]
        in ("zeroserve:prefix_cache_hits_total", "zeroserve:prefix_cache_hits")
    ]
    return sum(vals) if vals else None


def diffs(got: list, want: list) -> dict:
    pairs = [(g, w) for g, w in zip(got[1:], want[1:]) if g is not None and w is not None]
    d = [abs(g - w) for g, w in pairs]
    return {
        "n": len(d),
        "max_abs": max(d) if d else None,
        "mean_abs": sum(d) / len(d) if d else None,
        "argmax_pos": (d.index(max(d)) + 1) if d else None,
    }


def agree(a: list, b: list) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check(url: str, ref_path: str, out: str) -> int:
    ref = json.loads(Path(ref_path).read_text())
    res: dict = {"prompts": [], "errors": []}
    ok = True
    lps: dict[tuple[str, int], list] = {}  # (pass, prompt) -> the prompt's logprobs
    gen1: dict[tuple[str, int], tuple[str, float]] = {}  # (round, prompt) -> token, logprob
    with httpx.Client(timeout=120.0, trust_env=False) as c:
        model = c.get(url + "/v1/models").json()["data"][0]["id"]
        res["model"] = model
        ids = [p["ids"] for p in ref["prompts"]]
        # one prompt at a time, then all three in one request, twice (batched prefill;
        # prompt-logprob requests bypass the prefix cache, so both compute every token)
        passes: list[tuple[str, list]] = [(f"single{i}", [p]) for i, p in enumerate(ids)]
        passes += [("batch", ids), ("batch_again", ids)]
        for name, prompts in passes:
            body = {"model": model, "prompt": prompts if len(prompts) > 1 else prompts[0]}
            body |= {"max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}
            try:
                t = time.perf_counter()
                r = post(c, url, body)
                dt = time.perf_counter() - t
            except Exception as e:  # noqa: BLE001
                res["errors"].append(f"{name}: {e}")
                log(f"{name}: {e}")
                ok = False
                continue
            for ch in r["choices"]:
                k = int(ch["index"]) if len(prompts) > 1 else int(name[-1])
                p = ref["prompts"][k]
                lp = ch["logprobs"]["token_logprobs"][: p["n"]]
                lps[(name, k)] = lp
                entry = {
                    "pass": name,
                    "prompt": k,
                    "n": p["n"],
                    "seconds": round(dt, 3),
                    "vs_fp32": diffs(lp, p.get("lp_fp32") or []),
                    "vs_hf_bf16": diffs(lp, p["lp_bf16"]),
                    "hf_bf16_vs_fp32_max_abs": p.get("hf_bf16_vs_fp32_max_abs"),
                    "returned": len(ch["logprobs"]["token_logprobs"]),
                }
                res["prompts"].append(entry)
                log(
                    f"{name} prompt {k} ({p['n']} tok): max|dlp| vs fp32 "
                    f"{entry['vs_fp32']['max_abs']}, vs hf bf16 {entry['vs_hf_bf16']['max_abs']} "
                    f"(hf bf16 vs fp32 {entry['hf_bf16_vs_fp32_max_abs']})"
                )
        # one generated token per prompt, no echo, twice: the second time the prompt's full
        # KV blocks come from the prefix cache (prompt-logprob requests above bypass it),
        # so only its tail is computed, attending to cached K/V
        res["gen1"] = []
        for rnd in ("first", "cached"):
            hits0 = prefix_hits(c, url)
            for k, p in enumerate(ids):
                body = {"model": model, "prompt": p, "max_tokens": 1, "temperature": 0}
                body |= {"logprobs": 1}
                try:
                    r = post(c, url, body)
                    ch = r["choices"][0]
                    lp = ch["logprobs"]["token_logprobs"][0]
                    tok = ch["logprobs"]["tokens"][0]
                    want = ref["prompts"][k].get("last_fp32") or {}
                    if not want:  # the reference stopped before float32: nothing to compare
                        raise RuntimeError("no float32 reference (hf_ref timed out?)")
                    e = {
                        "round": rnd,
                        "prompt": k,
                        "lp": lp,
                        "abs_vs_fp32": abs(lp - want["lp"]),
                        "same_token": tok == want.get("str"),
                        "hf_margin": want["margin"],
                    }
                    w16 = ref["prompts"][k].get("last_bf16") or {}
                    if w16:  # HF bf16's argmax and its logprob (in bf16)
                        e["abs_vs_hf_bf16"] = abs(lp - w16["lp"])
                    res["gen1"].append(e)
                    gen1[(rnd, k)] = (tok, lp)
                    log(
                        f"gen1 {rnd} prompt {k}: |dlp| {e['abs_vs_fp32']:.5f} same token "
                        f"{e['same_token']}"
                    )
                except Exception as ex:  # noqa: BLE001
                    res["errors"].append(f"gen1 {rnd} {k}: {ex}")
                    log(f"gen1 {rnd} {k}: {ex}")
                    ok = False
            hits1 = prefix_hits(c, url)
            if hits0 is not None and hits1 is not None:
                res[f"gen1_{rnd}_prefix_cache_hit_tokens"] = hits1 - hits0
                log(f"gen1 {rnd}: prefix cache hits +{hits1 - hits0} tokens")
        g = ref["greedy"]
        body = {"model": model, "prompt": ids[g["prompt_index"]], "max_tokens": len(g["bf16_ids"])}
        body |= {"temperature": 0, "ignore_eos": True, "logprobs": 1}
        try:
            t = time.perf_counter()
            r = post(c, url, body)
            greedy_s = time.perf_counter() - t
            ch = r["choices"][0]
            toks = ch["logprobs"]["tokens"]
            a16, a32 = agree(toks, g["bf16_strs"]), agree(toks, g.get("fp32_strs") or [])
            m = g["bf16_margins"]
            res["greedy"] = {
                "n": len(g["bf16_ids"]),
                "returned": len(toks),
                "agree_hf_bf16": a16,
                "agree_hf_fp32": a32,
                "hf_bf16_vs_fp32_agree": g.get("hf_bf16_vs_fp32_agree"),
                "hf_margin_at_first_diff": m[a16] if a16 < len(m) else None,
                "server_text": ch["text"][:300],
                "hf_text": g["bf16_text"][:300],
                "server_tokens": toks,
                "finish_reason": ch.get("finish_reason"),
                "seconds": round(greedy_s, 3),
                "usage": r.get("usage"),
            }
            log(
                f"greedy: {a16}/{len(g['bf16_ids'])} leading tokens agree with hf bf16, "
                f"{a32} with hf fp32 (hf bf16 vs fp32: {g.get('hf_bf16_vs_fp32_agree')}); "
                f"margin at first diff {res['greedy']['hf_margin_at_first_diff']}"
            )
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"greedy: {e}")
            log(f"greedy: {e}")
            ok = False
        try:  # a streamed chat request: the chat template and SSE path work on this model
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "Hi!"}],
                "max_tokens": 8,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            chunks = 0
            usage = None
            with c.stream("POST", url + "/v1/chat/completions", json=body) as s:
                if s.status_code != 200:
                    raise RuntimeError(f"HTTP {s.status_code}: {s.read()[:300]!r}")
                for line in s.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks += 1
                        d = json.loads(line[6:])
                        usage = d.get("usage") or usage
            res["chat_stream"] = {"chunks": chunks, "usage": usage}
            log(f"chat stream: {chunks} chunks, usage {usage}")
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"chat_stream: {e}")
            log(f"chat stream: {e}")
    for rnd in ("first", "cached"):
        d = [e["abs_vs_fp32"] for e in res.get("gen1", []) if e["round"] == rnd]
        res[f"gen1_{rnd}_max_abs_vs_fp32"] = max(d) if d else None
        d = [
            e["abs_vs_hf_bf16"]
            for e in res.get("gen1", [])
            if e["round"] == rnd and "abs_vs_hf_bf16" in e
        ]
        res[f"gen1_{rnd}_max_abs_vs_hf_bf16"] = max(d) if d else None
    # the same prompt twice: prompt logprobs recomputed (batch, batch_again; single vs
    # batch), and the first generated token fresh vs with the prompt from the prefix cache
    rep: dict = {}
    for a, b in (("batch", "batch_again"), ("single", "batch")):
        d = []
        for k in range(len(ids)):
            x, y = lps.get((a + str(k) if a == "single" else a, k)), lps.get((b, k))
            if x and y:
                d += [abs(u - v) for u, v in zip(x[1:], y[1:]) if u is not None and v is not None]
        rep[f"{a}_vs_{b}_max_abs"] = max(d) if d else None
    d, same = [], []
    for k in range(len(ids)):
        f, c = gen1.get(("first", k)), gen1.get(("cached", k))
        if f and c:
            d.append(abs(f[1] - c[1]))
            same.append(f[0] == c[0])
    rep["gen1_fresh_vs_cached_max_abs"] = max(d) if d else None
    rep["gen1_fresh_vs_cached_same_token"] = all(same) if same else None
    rep["cached_hit_tokens"] = res.get("gen1_cached_prefix_cache_hit_tokens")
    res["repeat"] = rep
    log(f"same prompt twice: {rep}")
    vs = [p["vs_fp32"]["max_abs"] for p in res["prompts"] if p["vs_fp32"]["max_abs"] is not None]
    res["max_abs_vs_fp32"] = max(vs) if vs else None
    res["per_prompt_max_abs_vs_fp32"] = {
        p["pass"] + ":" + str(p["prompt"]): p["vs_fp32"]["max_abs"] for p in res["prompts"]
    }
    dump(res, out)
    return 0 if ok else 1


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


def main() -> int:
    a = sys.argv[1:]
    cmd = a[0] if a else ""
    if cmd == "wait":
        spawn = float(a[5]) if len(a) > 5 else None
        return wait(a[1], int(a[2]), float(a[3]), a[4], spawn)
    if cmd == "check":
        return check(a[1], a[2], a[3])
    if cmd == "structured":
        return structured(a[1], a[2])
    if cmd == "fault":
        opts = dict(zip(a[4::2], a[5::2]))
        streams, tokens = int(opts.get("--streams", 16)), int(opts.get("--tokens", 4096))
        return fault(a[1], int(a[2]), a[3], streams, tokens)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
