"""The GPU check's summary as text (OUT/summary.txt and stdout): the speed table, the A/B of
the frontends, each process's CPU share per level, the server log's lines, correctness, and
the targets' verdicts, from the dict summarize.py builds.
"""

from __future__ import annotations


def fmt(x, nd=1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:,.{nd}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def frontends_ab(models: dict) -> list[str]:
    """l1b at 32 streams (ZS_AB_CONC) with the default's frontends and with one
    (gpu_check.sh's A/B)."""
    levels = list(((models.get("l1b_1fe") or {}).get("bench") or {}).keys())
    if not levels:
        return []
    c = "32" if "32" in levels else levels[0]  # ZS_AB_CONC
    L = [f"A/B, l1b at {c} streams in this run: the default's frontends against one"]
    for tag in ("l1b", "l1b_1fe"):
        b = ((models.get(tag) or {}).get("bench") or {}).get(c) or {}
        n = sum(1 for k in b.get("cpu_pct") or {} if k.startswith("frontend"))
        L.append(
            f"   {tag:<8} {n} frontend(s): {fmt(b.get('out_tok_s'), 0)} tok/s, TTFT median "
            f"{fmt(b.get('ttft_med_ms'))} ms, GPU in forwards {fmt(b.get('device_pct'))}% "
            f"(between chained ones {fmt(b.get('device_wait_pct'))}%), nvidia-smi "
            f"{fmt((b.get('gpu') or {}).get('util_mean'))}%"
        )
    return L


def table(s: dict) -> str:
    env = s.get("env") or {}
    L = []
    L.append(
        f"zeroserve GPU check: {env.get('nvidia_smi_L') or env.get('gpu') or 'no GPU'} | torch "
        f"{env.get('torch')} (cuda {env.get('torch_cuda')}) | transformers "
        f"{(env.get('versions') or {}).get('transformers')} | python {env.get('python')} | "
        f"{s['elapsed_s']}s of {s['budget_s']}s"
    )
    if env.get("import_errors"):
        L.append(f"IMPORT ERRORS: {env['import_errors']}")
    st = s.get("stages") or []
    L.append("stages: " + " ".join(f"{x['stage']}={x['rc']}({x['s']}s)" for x in st))
    for x in st:
        if x["rc"] == "skip":
            L.append(f"SKIP {x['stage']}: {x['why']}")
    bad = [f"{x['stage']}={x['rc']}" for x in st if x["rc"] not in ("0", "skip")]
    if bad:
        L.append("FAILED (rc != 0; see stages.log): " + ", ".join(bad))
    pt = s.get("pytest")
    if pt:
        miss = f" (missing: {', '.join(pt['missing'])})" if pt.get("missing") else ""
        L.append(f"GPU kernel tests: {pt.get('summary')}{miss}")
        for f in pt.get("failed") or []:
            L.append(f"   {f}")
    pf = s.get("pytest_families")
    if pf and pf.get("summary"):
        L.append(f"every family on the GPU's kernels and graphs: {pf['summary']}")
        for f in pf.get("failed") or []:
            L.append(f"   {f}")
    L.append("")
    hdr = (
        f"{'model':<6} {'1 str':>8} {'8':>8} {'32':>8} {'64':>8} {'128':>8} {'256':>8} "
        f"{'TPOT1 ms':>9} {'GPU%@32':>8}"
        f" {'HF+c b1':>8} {'HF+c b32':>9} {'x b1':>6} {'x b32':>6} {'start s':>8}"
    )
    L.append("output tok/s (128 out, ~100 in); HF+c = transformers generate, static cache +")
    L.append("torch.compile; x = zeroserve / HF+c (1 stream vs batch 1, 32 streams vs batch 32)")
    L.append(hdr)
    for tag, row in (s.get("speed") or {}).items():
        L.append(
            f"{tag:<6} {fmt(row['tok_s_1'], 0):>8} {fmt(row['tok_s_8'], 0):>8} "
            f"{fmt(row['tok_s_32'], 0):>8} {fmt(row['tok_s_64'], 0):>8} "
            f"{fmt(row['tok_s_128'], 0):>8} {fmt(row['tok_s_256'], 0):>8} "
            f"{fmt(row['tpot_1_ms'], 3):>9} {fmt(row['gpu_busy_32']):>8} "
            f"{fmt(row['hf_b1'], 0):>8} {fmt(row['hf_b32'], 0):>9} {fmt(row['ratio_b1'], 2):>6} "
            f"{fmt(row['ratio_b32'], 2):>6} {fmt(row['startup_s'], 2):>8}"
        )
    L.append("l1b / l8b: Llama-3.2-1B's / Llama-3.1-8B's shapes (vocab 128,256), random weights")
    models = s.get("models") or {}
    L.append("start-up (spawn -> /health 200) and the first request's TTFT against the steady")
    L.append("median (client_first.py; *_cold: an empty kernel cache):")
    for tag, m in models.items():
        f = m.get("first") or {}
        L.append(
            f"   {tag}: start {fmt(m.get('startup_s'), 2)} s; first TTFT "
            f"{fmt(f.get('first_ttft_ms'))} ms, steady {fmt(f.get('steady_median_ttft_ms'))} ms, "
            f"ratio {fmt(f.get('ratio'), 2)}{' ' + str(f['errors']) if f.get('errors') else ''}"
        )
    for tag, m in models.items():
        for c, b in (m.get("bench") or {}).items():
            if "skipped" in b:
                L.append(f"   {tag} c={c}: skipped ({b['skipped']})")
            elif b.get("rc") or b.get("failed"):
                L.append(
                    f"   {tag} c={c}: rc={b.get('rc')} failed={b.get('failed')} "
                    f"{b.get('errors') or (b.get('tail') or '')[-200:]}"
                )
    L += frontends_ab(models)
    L.append("CPU % of one core per level (server processes over the requests' span; the")
    L.append("client with its start-up; c=32/1client: the level again with one client process):")
    for tag, m in models.items():
        for c, b in (m.get("bench") or {}).items():
            if b.get("cpu_pct"):
                cpu = " ".join(f"{k.split('.')[0]} {v}" for k, v in b["cpu_pct"].items())
                gpu = f"GPU in forwards {fmt(b.get('device_pct'))}%, between chained ones "
                gpu += f"{fmt(b.get('device_wait_pct'))}%"
                L.append(f"   {tag} c={c}: {fmt(b.get('out_tok_s'), 0)} tok/s | {cpu} | {gpu}")
    for key, v in (s.get("hf_compile") or {}).items():
        if v.get("error") or v.get("barrier") or v.get("dynamo_graphs") == 0 or v.get("exit"):
            L.append(f"   HF+c {key}: {v}")
    L.append("")
    L.append("server log (graph / KV lines):")
    for tag, m in models.items():
        if not m.get("ready") and not m.get("server_graph_lines"):
            L.append(f"   {tag}: not ready {m.get('not_ready')}")
        for ln in (m.get("server_graph_lines") or []) + (m.get("server_kv_lines") or []):
            L.append(f"   {tag}: {ln}")
        if not m.get("server_graph_lines"):
            L.append(f"   {tag}: (no line mentions 'graph')")
        for ln in (m.get("server_log_flags") or [])[:3]:
            L.append(f"   {tag} flagged: {ln}")
    L.append("")
    L.append("correctness:")
    for tag, m in models.items():
        c = m.get("check")
        if tag == "l1b_1fe":
            continue  # the A/B's server: l1b's model and flags but one frontend
        if not c:
            L.append(
                f"   {tag}: no correctness check ({'server not ready' if not m.get('ready') else 'see stages.log'})"
            )
            continue
        g = c.get("greedy") or {}
        L.append(
            f"   {tag}: prompt logprobs max|d| vs transformers fp32 {fmt(c['max_abs_vs_hf_fp32'], 6)}"
            f" (transformers bf16 vs fp32: {fmt(c['hf_bf16_vs_fp32_max_abs'], 6)}); 1st token "
            f"|d| {fmt(c['gen1_first_max_abs_vs_fp32'], 6)}; greedy {g.get('agree_hf_bf16')}/"
            f"{g.get('n')} = HF bf16, {g.get('agree_hf_fp32')}/{g.get('n')} = HF fp32 (HF bf16 vs"
            f" fp32 {g.get('hf_bf16_vs_fp32_agree')})"
        )
        rep = c.get("repeat") or {}
        L.append(
            f"   {tag} same prompt twice: prompt logprobs max|d| "
            f"{fmt(rep.get('batch_vs_batch_again_max_abs'), 6)} (single vs batched "
            f"{fmt(rep.get('single_vs_batch_max_abs'), 6)}); 1st token fresh vs prefix cache "
            f"|d| {fmt(rep.get('gen1_fresh_vs_cached_max_abs'), 6)}, same token "
            f"{rep.get('gen1_fresh_vs_cached_same_token')}, cache hit tokens "
            f"{rep.get('cached_hit_tokens')}"
        )
        if c.get("errors"):
            L.append(f"   {tag} check errors: {c['errors'][:3]}")
    for tag, m in models.items():
        st_ = m.get("structured")
        if st_:
            js, tl = (
                (st_.get("json_schema_tries") or [{}])[-1],
                (st_.get("tool_required_tries") or [{}])[-1],
            )
            L.append(
                f"   structured ({tag}): json_schema {st_.get('json_schema')} "
                f"(finish {js.get('finish_reason')}, {js.get('content', js.get('error', ''))[:80]!r});"
                f" tool_choice required {st_.get('tool_required')} (finish "
                f"{tl.get('finish_reason')}, {tl.get('function')}"
                f"({tl.get('arguments', tl.get('error', ''))[:60]}))"
            )
        ov = m.get("overlap")
        if ov:
            checks = ", ".join(f"{k} {ov.get(k)}" for k in ("seeded", "stop", "n", "grammar"))
            L.append(f"   overlapped options ({tag}): {checks}")
        fm = m.get("faults")
        if fm:
            L.append(
                f"   fault mix ({tag}, {fm.get('streams')} streams {fm.get('kinds')}): "
                f"{fm.get('verdict')}; whole streams' tok/s {(fm.get('faults') or {}).get('tok_s')}"
                f" against {(fm.get('clean') or {}).get('tok_s')} without the faults (x"
                f"{fm.get('tok_s_ratio')}); idle after {(fm.get('after') or {}).get('idle')}; "
                f"problems {(fm.get('problems') or [])[:2]}"
            )
        f = m.get("fault")
        if f:
            L.append(
                f"   fault ({tag}, kill -9 scheduler under {f.get('streams_started')}/"
                f"{f.get('streams')} streams): {f.get('verdict')}; streams ended "
                f"{f.get('streams_ended')}/{f.get('streams')} within "
                f"{fmt(f.get('streams_ended_max_s'), 2)}s {f.get('stream_endings')}; /health "
                f"down at {fmt(f.get('health_down_seen_s'), 2)}s, back at "
                f"{fmt(f.get('health_back_s'), 2)}s; next request ok "
                f"{f.get('after_request_ok')} ({fmt(f.get('after_request_s'), 2)}s)"
            )
    if not any(m.get("structured") for m in models.values()):
        L.append("   structured / tool call: not run (see SKIP above)")
    if not any(m.get("fault") for m in models.values()):
        L.append("   fault check: not run (see SKIP above)")
    prof = s.get("profile") or []
    if prof:
        L.append("")
        L.append("profile (l1b or l8b, in process):")
        L.extend(f"   {p}" for p in prof)
    L.append("")
    L.append("TARGETS")
    for t in s.get("targets") or []:
        L.append(f"   [{t['verdict']}] {t['target']}: {t['shown']}")
    return "\n".join(L)
