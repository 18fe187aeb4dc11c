"""Perplexity of a fixed public-domain text through the server's /v1/completions (echo +
logprobs, max_tokens 0), in llama-perplexity's windows, against llama.cpp's
`llama-perplexity` on the same GGUF file and text.

    LP=/tmp/llama.cpp/build/bin/llama-perplexity
    .venv/bin/python benchmarks/bench_perplexity.py --model /tmp/gguf/smollm2-q4_k_m.gguf \
        --llama-perplexity $LP --ctx-size 512 --chunks 8
    .venv/bin/python benchmarks/bench_perplexity.py --base-url http://127.0.0.1:8000   # a running server

The text (default benchmarks/data/pride_and_prejudice_ch1-6.txt, public domain, ~10k
tokens) is tokenized by the server (/tokenize, with its special tokens: a BOS where the
model adds one) and cut as llama-perplexity cuts it (benchmarks/perplexity/windows.py):
windows of --ctx-size tokens, each sent as token ids, its first token replaced by BOS
where the model adds one, the second half of each window scored. Without --base-url the
script starts `launch.py --model MODEL` itself (default flags plus --engine-args) and
stops it after. With --llama-perplexity it runs
`llama-perplexity -m GGUF -f TEXT -c CTX [--chunks N] -t THREADS` on the same file and
text and prints both results with their ratio (the issue's target: within 1%).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python benchmarks/bench_perplexity.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.perplexity import llama_perplexity
from benchmarks.perplexity.windows import Perplexity, plan_windows, scored_logprobs
from benchmarks.perplexity.windows import window_logprobs as response_logprobs

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = REPO / "benchmarks" / "data" / "pride_and_prejudice_ch1-6.txt"
TARGET = 0.01  # within 1% of llama-perplexity


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base-url", help="a running server (default: start launch.py)")
    p.add_argument("--model", default="smollm2", help="launch.py --model (a .gguf file)")
    p.add_argument("--engine-args", default="", help="more launch.py flags")
    p.add_argument("--text", default=str(DEFAULT_TEXT))
    p.add_argument("--ctx-size", type=int, default=512, help="window size, as -c")
    p.add_argument("--chunks", type=int, default=0, help="at most this many windows (0: all)")
    p.add_argument("--llama-perplexity", help="llama.cpp's llama-perplexity binary")
    p.add_argument("--gguf", help="GGUF for llama-perplexity (default: --model's file)")
    p.add_argument("--threads", type=int, default=None, help="llama -t (default: torch's)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--request-timeout", type=float, default=600.0)
    p.add_argument("--log-dir", help="keep the server's log here")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.ctx_size < 4 or args.chunks < 0:
        p.error("--ctx-size >= 4, --chunks >= 0")
    return args


def _headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def tokenize(client: Any, args: argparse.Namespace, text: str) -> tuple[list[int], int | None]:
    """(the text's token ids with the model's special tokens, the BOS id or None when the
    model adds none): /tokenize with and without add_special_tokens."""

    def ids(special: bool) -> list[int]:
        r = client.post(
            "/tokenize",
            json={"prompt": text, "add_special_tokens": special},
            headers=_headers(args),
        )
        r.raise_for_status()
        return list(r.json()["tokens"])

    with_special, plain = ids(True), ids(False)
    if with_special == plain:
        return with_special, None
    if with_special[1:] == plain:
        return with_special, with_special[0]
    raise RuntimeError(
        "add_special_tokens adds more than a leading BOS to this text "
        f"({len(with_special)} vs {len(plain)} tokens): not llama-perplexity's windows"
    )


def score_window(client: Any, args: argparse.Namespace, model: str, ids: list[int]) -> list[float]:
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 0,
        "temperature": 0,
    }
    r = client.post("/v1/completions", json=body, headers=_headers(args))
    if r.status_code != 200:
        raise RuntimeError(f"/v1/completions: HTTP {r.status_code}: {r.text[:300]}")
    return scored_logprobs(response_logprobs(r.json()), len(ids))


def server_perplexity(args: argparse.Namespace, client: Any, text: str) -> dict[str, Any]:
    """The text's perplexity through a server (`client`: an httpx.Client on its base URL)."""
    model = client.get("/v1/models", headers=_headers(args)).json()["data"][0]["id"]
    tokens, bos = tokenize(client, args, text)
    windows = plan_windows(tokens, args.ctx_size, args.chunks or None, bos)
    acc = Perplexity()
    t0 = time.perf_counter()
    for w in windows:
        acc.add(score_window(client, args, model, w.token_ids))
        print(f"[{w.index + 1}]{acc.running[-1]:.4f},", end="", flush=True)
    print()
    return {
        "ppl": acc.ppl,
        "stderr": acc.stderr,
        "num_chunks": len(windows),
        "scored_tokens": acc.count,
        "text_tokens": len(tokens),
        "bos_id": bos,
        "running": acc.running,
        "seconds": time.perf_counter() - t0,
    }


def default_gguf(args: argparse.Namespace) -> str | None:
    if args.gguf:
        return args.gguf
    if args.model == "smollm2":
        from common.model_files.model_source import default_gguf_path

        return str(default_gguf_path())
    return args.model if args.model.endswith(".gguf") else None


def run_llama(args: argparse.Namespace) -> dict[str, Any]:
    gguf = default_gguf(args)
    if gguf is None:
        raise SystemExit("--llama-perplexity needs a GGUF file: pass --gguf FILE")
    if args.threads is None:
        import torch

        args.threads = torch.get_num_threads()
    argv = llama_perplexity.command(
        args.llama_perplexity, gguf, args.text, args.ctx_size, args.chunks or None, args.threads
    )
    print(f"running {shlex.join(argv)}", flush=True)
    t0 = time.perf_counter()
    res, _out = llama_perplexity.run(argv)
    return {**res.__dict__, "command": argv, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = Path(args.text).read_text(encoding="utf-8")
    out: dict[str, Any] = {"args": vars(args), "text": args.text}
    server = None
    try:
        base_url = args.base_url
        if base_url is None:
            from benchmarks.comparison.zeroserve_proc import Zeroserve

            log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="zs-ppl-"))
            log_dir.mkdir(parents=True, exist_ok=True)
            server = Zeroserve(args.model, shlex.split(args.engine_args), log_dir / "server.log")
            print(f"starting launch.py --model {args.model} (log {server.log_path})", flush=True)
            server.start(args.startup_timeout)
            base_url = server.proc.base_url
            out["server_command"] = server.command
        import httpx

        with httpx.Client(base_url=base_url, timeout=args.request_timeout) as client:
            out["server"] = server_perplexity(args, client, text)
    finally:
        if server is not None:
            server.stop()
            if not args.log_dir:
                shutil.rmtree(server.log_path.parent, ignore_errors=True)
    s = out["server"]
    print(
        f"server:           PPL = {s['ppl']:.4f} +/- {s['stderr']:.5f} ({s['num_chunks']} "
        f"chunks of {args.ctx_size}, {s['scored_tokens']} tokens scored, text "
        f"{s['text_tokens']} tokens, {s['seconds']:.1f} s)"
    )
    if args.llama_perplexity:
        lp = out["llama_perplexity"] = run_llama(args)
        ratio = s["ppl"] / lp["ppl"]
        out["ratio"] = ratio
        ok = abs(math.log(ratio)) <= math.log1p(TARGET)
        print(
            f"llama-perplexity: PPL = {lp['ppl']:.4f} +/- {lp['stderr']:.5f} "
            f"({lp['num_chunks']} chunks of {lp['n_ctx']}, {lp['seconds']:.1f} s)"
        )
        if lp["num_chunks"] != s["num_chunks"]:
            print(
                f"warning: {s['num_chunks']} vs {lp['num_chunks']} chunks: the two tokenizers "
                "cut the text differently"
            )
        print(
            f"ratio server / llama-perplexity = {ratio:.4f} ({(ratio - 1) * 100:+.2f}%): "
            f"{'PASS' if ok else 'FAIL'} (target: within {TARGET:.0%})"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
