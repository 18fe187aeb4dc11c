"""The HTTP side of the GPU check.

python client.py wait  URL PID TIMEOUT_S OUT.json [SPAWN_EPOCH]
    /health 200 (launch.py opens the port only when all are up); seconds from
    SPAWN_EPOCH (the driver's spawn time) when given, else from this call
python client.py check URL REF.json OUT.json
    prompt logprobs and greedy vs transformers (hf_ref.py's REF), the same prompts
    twice (prompt logprobs recomputed, then one token fresh and from the prefix cache)
python client.py first URL OUT.json [--steady 8] [--max-tokens 8]
    the first request after /health against the steady ones (client_first.py)
python client.py structured URL OUT.json
    a response_format json_schema chat request and a tool_choice "required" request:
    does the output parse (JSON / the tool call's arguments)?
python client.py preempt URL OUT.json [--streams 16] [--tokens 256] [--exact 1]
    a KV pool too small for the load: every request ends whole, the server preempted,
    each greedy text against the same request's alone (client_preempt.py)
python client.py fault URL LAUNCH_PID OUT.json [--streams 16] [--tokens 4096]
    kill -9 the scheduler under streaming load: do the streams end, does /health come
    back (launch.py restarts a dead child), is the next request served?
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
from client_first import first
from client_load import fault, structured
from client_overlap import overlap
from client_preempt import preempt
from client_util import alive, dump, log, post


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


def main() -> int:
    a = sys.argv[1:]
    cmd = a[0] if a else ""
    if cmd == "wait":
        spawn = float(a[5]) if len(a) > 5 else None
        return wait(a[1], int(a[2]), float(a[3]), a[4], spawn)
    if cmd == "check":
        return check(a[1], a[2], a[3])
    if cmd == "first":
        opts = dict(zip(a[3::2], a[4::2]))
        return first(a[1], a[2], int(opts.get("--steady", 8)), int(opts.get("--max-tokens", 8)))
    if cmd == "structured":
        return structured(a[1], a[2])
    if cmd == "overlap":
        opts = dict(zip(a[3::2], a[4::2]))
        return overlap(a[1], a[2], int(opts.get("--others", 127)), int(opts.get("--tokens", 48)))
    if cmd == "preempt":
        opts = dict(zip(a[3::2], a[4::2]))
        streams, tokens = int(opts.get("--streams", 16)), int(opts.get("--tokens", 256))
        return preempt(a[1], a[2], streams, tokens, opts.get("--exact", "0") == "1")
    if cmd == "fault":
        opts = dict(zip(a[4::2], a[5::2]))
        streams, tokens = int(opts.get("--streams", 16)), int(opts.get("--tokens", 4096))
        return fault(a[1], int(a[2]), a[3], streams, tokens)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
