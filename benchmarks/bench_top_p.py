"""Top-p without a sort of the vocabulary (issue 52, item 3): ms per call of the sampler's
top-p step, main's (2cd4c57, below as `old_*`) against this tree's
(scheduler_worker/top_p.py), in the same run, at real shapes.

    .venv/bin/python benchmarks/bench_top_p.py [--device cuda] [--shapes 256x128256,...]

Rows (synthetic, seeded; --dists):
  chat  a chat client's: p ~ rank^-a over a shuffled vocabulary, a = 1.28 + lognormal(-1.14,
        0.76) a row (at temperature 1 its nuclei match SmolLM2-135M's next-token
        distributions on the book: top_p 0.95 holds 77 / 563 / 1,477 tokens at the median,
        90th and 99th percentile), then temperature 0.7-1.0 and top_p 0.9 or 0.95 a row, a
        quarter of the rows with top_k 40 or 50
  flat  a random-weight model's (--load-format dummy, as the GPU check serves l1b and l8b):
        logits ~ N(0, 0.5^2), top_p 0.9: the nucleus is most of the vocabulary
Steps timed (the probabilities after temperature, top-k and softmax are the input):
  old sort    main's GPU way: each top-p row's whole vocabulary sorted, a float32 cumsum
  old cpu     main's CPU way: topk 256, then 4096, then a full sort, each for the rows left
  new         this tree's way on this device (top_p_thresholds: a top-k row from its
              candidates; else on a CPU windows then the radix search, on a GPU the search)
  new radix   the radix search on every top-p row (the GPU's way, timed on this device)
and, for scale, the whole sampling_probs with the new step and topk(256) of every row.
Each line also checks the new thresholds against a float64 sort (`exact`) and counts the
rows whose kept set differs from main's float32 rule (a prefix's mass within float32
rounding of top_p: the float64 sum decides, see scheduler_worker/top_p.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.sampling_params import SamplingParams  # noqa: E402
from scheduler_worker import sampling, top_p  # noqa: E402
from scheduler_worker.logits_processors import _tensor  # noqa: E402


def old_top_p_threshold(probs: torch.Tensor, top_p: torch.Tensor, cpu_way: bool) -> torch.Tensor:
    """main's _top_p_threshold (2cd4c57): a full sort on a GPU, candidates on a CPU."""
    vocab = probs.shape[1]
    if not cpu_way:
        return old_cut(probs.sort(dim=-1, descending=True).values, top_p)
    sizes = [n for n in (256, 4096) if n < vocab] + [vocab]
    thresh = torch.empty_like(top_p)
    todo = torch.arange(probs.shape[0], device=probs.device)
    for num in sizes:
        sub = probs[todo]
        top = sub.sort(dim=-1, descending=True).values if num == vocab else sub.topk(num).values
        done = (top.sum(dim=-1) >= top_p[todo, 0]) | (num == vocab)
        thresh[todo[done]] = old_cut(top[done], top_p[todo[done]])
        todo = todo[~done]
        if len(todo) == 0:
            break
    return thresh


def old_cut(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    num_keep = (mass_above < top_p).sum(dim=-1, keepdim=True).clamp_(min=1)
    return sorted_probs.gather(1, num_keep - 1)


def old_thresholds(probs, top_ps, top_ks, candidates, may_branch) -> torch.Tensor:
    """main's top-p step in sampling_probs: every top-p row through old_top_p_threshold."""
    dev = probs.device
    thresh = probs.new_zeros(len(top_ps), 1)
    rows = [i for i, p in enumerate(top_ps) if p < 1.0]
    if rows:
        want = _tensor([float(top_ps[i]) for i in rows], dev)[:, None]
        sel = _tensor(rows, dev)
        cut = old_top_p_threshold(probs.index_select(0, sel), want, may_branch)
        thresh.index_copy_(0, sel, cut)
    return thresh


def make_rows(dist: str, rows: int, vocab: int, device: str, seed: int = 0):
    """(logits [rows, vocab] on device, params): see the module's docstring. Drawn on the
    device (its own generator: other draws than a CPU's, the same kind of rows)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    kw = dict(generator=gen, device=device)
    if dist == "flat":
        return torch.randn(rows, vocab, **kw) * 0.5, [SamplingParams(top_p=0.9)] * rows
    a = 1.28 + torch.exp(torch.randn(rows, 1, **kw) * 0.76 - 1.14)
    ranks = torch.argsort(torch.rand(rows, vocab, **kw), dim=-1).float() + 1
    logits = -a * ranks.log() + 0.1 * torch.randn(rows, vocab, **kw)
    params = []
    for i in range(rows):
        row = dict(temperature=(0.7, 0.8, 0.9, 1.0)[i % 4], top_p=(0.9, 0.95)[i // 4 % 2])
        if i % 4 == 3:
            row["top_k"] = (40, 50)[i // 8 % 2]
        params.append(SamplingParams(**row))
    return logits, params


def prepare(logits: torch.Tensor, params: list[SamplingParams]):
    """sampling_probs up to top-p: (probs, top_ps, top_ks, candidates)."""
    vocab = logits.shape[1]
    logits = logits / _tensor([p.temperature for p in params], logits.device)[:, None]
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    candidates = None
    if any(ks):
        top = logits.topk(max(ks), dim=-1)
        k = _tensor([k or 1 for k in ks], logits.device)[:, None]
        kth = top.values.gather(1, k - 1)
        kth.masked_fill_(_tensor([n == 0 for n in ks], logits.device)[:, None], float("-inf"))
        logits = logits.masked_fill(logits < kth, float("-inf"))
        candidates = top.indices
    # as the sampler hands them over (batch_params: numpy columns)
    top_ps = np.array([p.top_p for p in params], dtype=np.float64)
    return logits.softmax(dim=-1), top_ps, np.array(ks, dtype=np.int64), candidates


def timed(fn, device: str, repeat: int, clock: str = "wall") -> float:
    """ms of the fastest of `repeat` calls after one warm-up (the device synchronized);
    clock "cpu": this process's CPU time (every thread's), steadier than the wall clock
    on a machine other work shares."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    now = time.process_time if clock == "cpu" else time.perf_counter
    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = now()
        fn()
        sync()
        best = min(best, now() - t0)
    return best * 1e3


def exact_reference(probs, top_ps, top_ks) -> torch.Tensor:
    """The float64 rule on a full sort (top-k already applied to probs)."""
    ref = probs.new_zeros(len(top_ps), 1)
    rows = [i for i, p in enumerate(top_ps) if p < 1.0]
    if rows:
        sel = _tensor(rows, probs.device)
        srt = probs.index_select(0, sel).sort(dim=-1, descending=True).values
        want = _tensor([top_ps[i] for i in rows], probs.device)[:, None]
        ref.index_copy_(0, sel, top_p.window_threshold(srt, want)[0])
    return ref


def run(shape: str, dist: str, device: str, repeat: int, skip_sort: bool, clock: str) -> None:
    rows, vocab = (int(x) for x in shape.split("x"))
    logits, params = make_rows(dist, rows, vocab, device)
    probs, top_ps, top_ks, candidates = prepare(logits, params)
    branch = not sampling.enqueues_work(probs.device)
    new = top_p.top_p_thresholds(probs, top_ps, top_ks, candidates, branch)
    old = old_thresholds(probs, top_ps, top_ks, candidates, branch)
    ref = exact_reference(probs, top_ps, top_ks)
    exact = bool(torch.equal(new, ref))
    differ = int(((probs >= new) != (probs >= old)).any(dim=-1).sum())
    nucleus = (probs >= new).sum(dim=-1).float()
    everyone = [i for i, p in enumerate(top_ps) if p < 1.0]
    search_rows = [i for i in everyone if not top_ks[i]]
    sel = _tensor(search_rows, probs.device)
    sub = probs.index_select(0, sel)
    want = _tensor([top_ps[i] for i in search_rows], probs.device)[:, None]
    ms = {}
    if not skip_sort:
        ms["old sort"] = timed(
            lambda: old_thresholds(probs, top_ps, top_ks, candidates, False), device, repeat, clock
        )
    ms["old cpu"] = timed(
        lambda: old_thresholds(probs, top_ps, top_ks, candidates, True), device, repeat, clock
    )
    ms["new"] = timed(
        lambda: top_p.top_p_thresholds(probs, top_ps, top_ks, candidates, branch),
        device,
        repeat,
        clock,
    )
    ms["new radix"] = timed(lambda: top_p.radix_threshold(sub, want), device, repeat, clock)
    ms["sampling_probs"] = timed(
        lambda: sampling.sampling_probs(logits, params), device, repeat, clock
    )
    ms["topk256"] = timed(lambda: probs.topk(256), device, repeat, clock)
    q = nucleus.quantile(torch.tensor([0.5, 0.9, 1.0], device=nucleus.device)).tolist()
    figures = "  ".join(f"{k} {v:.2f}" for k, v in ms.items())
    print(
        f"{device} {rows}x{vocab} {dist}: {figures} ms | exact {exact}, rows unlike main's "
        f"float32 rule {differ}/{len(everyone)}, nucleus p50/p90/max "
        f"{q[0]:.0f}/{q[1]:.0f}/{q[2]:.0f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--shapes", default="256x128256,256x49152,32x128256")
    ap.add_argument("--dists", default="chat,flat")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls a figure (the fastest)")
    ap.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="cpu: this process's CPU time (a shared machine's steadier figure)",
    )
    ap.add_argument(
        "--threads", type=int, default=0, help="torch threads on a CPU (0: torch's default)"
    )
    ap.add_argument(
        "--skip-sort-above",
        type=int,
        default=0,
        help="skip `old sort` where rows x vocab exceeds this (0: never; a CPU sort of "
        "256 x 128,256 takes seconds)",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
        f"{args.clock} clock, fastest of {args.repeat}"
    )
    for shape in args.shapes.split(","):
        rows, vocab = (int(x) for x in shape.split("x"))
        skip = 0 < args.skip_sort_above < rows * vocab
        for dist in args.dists.split(","):
            run(shape, dist, args.device, args.repeat, skip, args.clock)


if __name__ == "__main__":
    main()
