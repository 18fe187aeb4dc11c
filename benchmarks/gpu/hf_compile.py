"""The peer baseline of the GPU check: transformers `generate`, greedy, with a static cache
and its automatic torch.compile (mode reduce-overhead: CUDA graphs), ~100-token prompts,
batch 1 and 32, for each model directory given.

    python hf_compile.py OUT.json MODEL_DIR [MODEL_DIR ...] [--batches 1,32]
    (a directory without weights: transformers' random init from its config.json)
        [--new-tokens 128] [--prompt-tokens 100] [--device cuda] [--go-file PATH]
        [--max-wait S] [--no-compile]

Compiling is the slow part (tens of seconds per model and batch size), so every (model,
batch) pair gets a worker process of its own, all started at once: each loads its model
and warms `generate` up (compile + graph capture) in parallel with the others, and with
whatever else the driver runs meanwhile. A worker then waits until every worker has warmed
up and the go file exists (the driver creates it once the GPU is otherwise idle), and
times its calls while holding a lock, so one worker measures at a time on an idle GPU.
Each measurement is kept where a worker is later killed: OUT.json is rewritten as each
worker ends (the driver's timeout reaches the workers: they share this process group).

Figures per pair: tok_s = batch * new_tokens / seconds of one whole generate call (prefill
included, as a server's output tok/s), decode_tok_s and ms_per_step from the same call less
a one-token call, and how many graphs dynamo compiled (0: it ran eagerly).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[hf_compile {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def die_with_parent() -> None:
    """SIGKILL this worker when the parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


def worker(args: argparse.Namespace) -> int:
    die_with_parent()
    import torch
    from transformers import AutoModelForCausalLM

    key, sync, out = args.key, Path(args.sync_dir), Path(args.part)
    dev = torch.device(args.device)
    b, new, plen = args.batch, args.new_tokens, args.prompt_tokens
    res: dict = {"model": args.model, "batch": b, "new_tokens": new, "prompt_tokens": plen}
    res["compile"] = not args.no_compile

    def sync_dev() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    t0 = time.perf_counter()
    try:
        with contextlib.suppress(AttributeError):
            torch._dynamo.config.cache_size_limit = 64  # never fall back to eager silently
        if any(Path(args.model).glob("*.safetensors")):
            m = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
        else:  # a config-only directory (served --load-format dummy): random, on the device
            from transformers import AutoConfig

            with torch.device(dev):
                m = AutoModelForCausalLM.from_config(
                    AutoConfig.from_pretrained(args.model), dtype=torch.bfloat16
                )
        m = m.to(dev).eval()
        m.generation_config.cache_implementation = "static"
        if args.no_compile:
            m.generation_config.disable_compile = True
        g = torch.Generator().manual_seed(b)
        ids = torch.randint(100, 40000, (b, plen), generator=g).to(dev)
        mask = torch.ones_like(ids)
        kw = {"do_sample": False, "pad_token_id": 0, "attention_mask": mask}
        res["load_s"] = round(time.perf_counter() - t0, 1)
        t = time.perf_counter()
        for _ in range(2):  # the first compiles and captures, the second runs the graphs
            m.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        m.generate(ids, max_new_tokens=1, **kw)
        sync_dev()
        res["warmup_s"] = round(time.perf_counter() - t, 1)
        try:
            from torch._dynamo.utils import counters

            res["dynamo_graphs"] = int(counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001 - a diagnostic only
            res["dynamo_graphs"] = None
        log(f"{key}: warm in {res['warmup_s']}s (graphs {res['dynamo_graphs']})")
    except Exception as e:  # noqa: BLE001 - record, release the barrier, exit
        res["error"] = f"{type(e).__name__}: {e}"[:400]
        log(f"{key}: failed: {res['error']}")
        write_json(out, res)
        (sync / f"ready.{key}").touch()
        return 1
    (sync / f"ready.{key}").touch()
    write_json(out, res)
    # barrier: every worker warm (or gone) and the driver's go (or the wait's end)
    t = time.time()
    while time.time() - t < args.max_wait:
        warm = len(list(sync.glob("ready.*"))) >= args.n_workers
        if warm and (not args.go_file or os.path.exists(args.go_file)):
            break
        time.sleep(0.2)
    else:
        res["barrier"] = f"gave up waiting after {args.max_wait:.0f}s (GPU possibly shared)"
    res["waited_s"] = round(time.time() - t, 1)
    with open(sync / "lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        try:
            runs = []
            for _ in range(2):
                sync_dev()
                t = time.perf_counter()
                m.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
                sync_dev()
                runs.append(time.perf_counter() - t)
            t = time.perf_counter()
            m.generate(ids, max_new_tokens=1, **kw)
            sync_dev()
            p = time.perf_counter() - t
            dt = min(runs)
            res.update(
                seconds=round(dt, 4),
                seconds_runs=[round(x, 4) for x in runs],
                seconds_one_token=round(p, 4),
                tok_s=round(b * new / dt, 1),
                decode_tok_s=round(b * (new - 1) / (dt - p), 1) if dt > p else None,
                ms_per_step=round((dt - p) / (new - 1) * 1000, 3) if dt > p else None,
            )
            log(f"{key}: {res['tok_s']} tok/s, {res['ms_per_step']} ms/step")
        except Exception as e:  # noqa: BLE001
            res["error"] = f"{type(e).__name__}: {e}"[:400]
            log(f"{key}: timing failed: {res['error']}")
        finally:
            fcntl.flock(lk, fcntl.LOCK_UN)
    write_json(out, res)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=100)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--go-file", default=None)
    ap.add_argument("--max-wait", type=float, default=150.0)
    ap.add_argument("--no-compile", action="store_true", help="static cache, eager (dry runs)")
    # a worker's own arguments
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--key", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    ap.add_argument("--sync-dir", help=argparse.SUPPRESS)
    ap.add_argument("--n-workers", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.model = args.models[0]
        return worker(args)

    out = Path(args.out)
    sync = out.with_name(out.name + ".sync")
    sync.mkdir(parents=True, exist_ok=True)
    for f in sync.iterdir():
        f.unlink()
    pairs = [(m, int(b)) for m in args.models for b in args.batches.split(",")]
    threads = max(1, (os.cpu_count() or 4) // len(pairs))
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(threads))
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    for m, b in pairs:
        key = f"{Path(m).name}_b{b}"
        part = sync / f"part.{key}.json"
        cmd = [sys.executable, __file__, "--worker", args.out, m, "--key", key]
        cmd += ["--batch", str(b), "--part", str(part), "--sync-dir", str(sync)]
        cmd += ["--n-workers", str(len(pairs)), "--max-wait", str(args.max_wait)]
        cmd += ["--new-tokens", str(args.new_tokens), "--prompt-tokens", str(args.prompt_tokens)]
        cmd += ["--device", args.device] + (["--go-file", args.go_file] if args.go_file else [])
        cmd += ["--no-compile"] if args.no_compile else []
        procs[key] = (subprocess.Popen(cmd, env=env), part)
        log(f"{key}: worker pid {procs[key][0].pid}")

    def stop(signum: int, _frame) -> None:
        for p, _ in procs.values():
            with contextlib.suppress(OSError):
                p.kill()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    res: dict = {"runs": {}}
    while True:
        for key, (p, part) in procs.items():
            with contextlib.suppress(OSError, ValueError):
                res["runs"][key] = json.loads(part.read_text())
            if p.poll() is not None:
                res["runs"].setdefault(key, {})["exit"] = p.returncode
        write_json(out, res)
        if all(p.poll() is not None for p, _ in procs.values()):
            break
        time.sleep(0.5)
    log("done: " + json.dumps({k: v.get("tok_s", v.get("error")) for k, v in res["runs"].items()}))
    return 0 if all(p.returncode == 0 for p, _ in procs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
