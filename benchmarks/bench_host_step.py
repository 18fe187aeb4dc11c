"""The host's share of a decode step: what the scheduler process does per row when the
device's work costs nothing (issue 38: on an H100 the 1B model's 128-stream steps and the
135M model's 32-stream steps wait on the host, ~10 µs a row a step).

The engine runs as served (overlapped scheduling on, greedy, ignore_eos) on a tiny model,
with the forward replaced by what a captured CUDA graph costs the host: the static inputs
filled (graphs.StaticDecodeInputs.fill, on CPU tensors) and logits returned from a buffer.
The sampler, the scheduler, the outputs and the worker's encoding for the detokenizer
(SchedulerWorker.publish, the message encoded, not sent) run for real. Prints µs a step and a
row, and with --profile the functions that take the time.

The chat mix's sampler runs its torch ops on the CPU (a GPU's device work), which the wall
clock cannot tell from the host's (preemption between its ops, the caches it evicts:
docs/benchmarks.md, "Host step, seventh session"). Its host figure is therefore its
Python's bytecodes a row (sys.settrace, load-free) times greedy's µs a bytecode, greedy
run at the same rows in the same process just before (docs/benchmarks.md, "Host step,
eighth session"). That estimate prices a C pass over the rows (map, setattr, np.fromiter)
at no bytecodes, though it can take 2-3x a plain loop's time ("Host step, tenth session"),
and it leaves out the torch ops' dispatch. `--mix chat-narrow` bounds it from above: the
mix without its grammar rows on logits 64 wide, by the thread's CPU, greedy alternated
beside it; the CPU's compute of the narrow sampler ops (a GPU's device work) still counts.
`--mix chat-narrow-json --width 320` puts the grammar rows back, their schema an array of
strings (every token it needs a single byte's, below BYTE_TOKENS, where the chat mix's
object key needs a token past any narrow width), and times it alternated with chat-narrow
at the same width: what the grammar rows add to the host's step.

    .venv/bin/python benchmarks/bench_host_step.py --rows 32 128 256 512
        [--mix chat|chat-narrow|chat-narrow-json]
    --draw torch         the sampler's draw as the torch path's ops (default: the GPU's one
                         launch, triton_sample.sample_rows_keyed, stood in for by one op)
    ZS_BYTECODES=1 ...   also greedy's bytecodes and calls a row a step (load-free)
    --ops                also the torch ops a step (load-free: on a GPU each one not a view
                         is a launch or a copy the host pays for; views cost their dispatch)
    --prompt-len N       prompts of N tokens (default 20): how the host's step grows with
                         the rows' contexts (their block tables), the rest unchanged
    --width N            the stand-in logits N wide (default 64): the CPU's share of the
                         sampler's device work (greedy's argmax, chat-narrow's ops) shrinks
                         with N, the host's Python does not change
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.host_counts import bytecodes, count_ops  # noqa: E402
from common import collector  # noqa: E402
from common.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig  # noqa: E402
from common.messages import encode  # noqa: E402
from common.sampling_params import SamplingParams  # noqa: E402
from scheduler_worker.backends.base import DecodeRows, DrawRows, MaskRows  # noqa: E402
from scheduler_worker.backends.graphs import StaticDecodeInputs  # noqa: E402
from scheduler_worker.engine import LLMEngine  # noqa: E402
from scheduler_worker.kernels import best_isa, isa_index  # noqa: E402
from scheduler_worker.kernels import load as load_kernels  # noqa: E402
from scheduler_worker.penalties import CPU_PENALIZE  # noqa: E402
from scheduler_worker.sampling import greedy_tokens  # noqa: E402
from scheduler_worker.worker import SchedulerWorker  # noqa: E402

VOCAB = 64  # greedy: the stand-in logits' width (the device's argmax costs the host nothing)
SCHEMA = (
    '{"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}}}}'
)
BYTES_SCHEMA = '{"type": "array", "items": {"type": "string"}}'  # chat-narrow-json's: every
BYTE_TOKENS = 273  # token it needs a single byte's (SmolLM2's lie below 273)


def chat_mix(i: int, grammar: bool = True, schema: str = SCHEMA) -> SamplingParams:
    """Request i of issue 52's chat mix: a quarter greedy, the rest temperature 0.7 and
    top_p 0.9; a quarter seeded; one in eight with logprobs 5, one in eight with
    presence_penalty 0.5, one in sixteen with a json_schema, `schema` (greedy instead
    without `grammar`)."""
    kw: dict = {"max_tokens": 480, "ignore_eos": True, "temperature": 0.0}
    if i % 4:
        kw.update(temperature=0.7, top_p=0.9)
    if i % 4 == 1:
        kw["seed"] = 1000 + i
    if i % 8 == 2:
        kw["logprobs"] = 5
    if i % 8 == 3:
        kw["presence_penalty"] = 0.5
    if i % 16 == 6 and grammar:
        kw["structured"] = {"kind": "json", "spec": schema}
    return SamplingParams(**kw)


class GraphLike:
    """runner.execute as a replayed decode graph costs the host: its inputs staged (the
    step in flight's tokens already on the device). The chat mix gets logits as wide as
    the vocabulary (a grammar allows the model's own tokens: cut to a few, a row can be
    left with none)."""

    def __init__(self, engine: LLMEngine, max_rows: int, vocab: int = VOCAB) -> None:
        runner = engine.runner
        self.inputs = StaticDecodeInputs(
            max_rows, _max_blocks(), torch.device("cpu"), runner.num_blocks, runner.block_size
        )
        logits = torch.randn(max_rows, vocab, generator=torch.Generator().manual_seed(0))
        # peaked as a model's: the byte-level tokens hold ~95% of the mass (a flat row makes
        # top_p 0.9 keep tens of thousands of tokens, which no model's logits do)
        logits[:, :256] += 8.0
        self.logits, self.real = logits, runner.execute
        self.prev_tokens = torch.full((max_rows,), 7, dtype=torch.long)

    def __call__(self, seqs, argmax_vocab=None):
        if not isinstance(seqs, DecodeRows):  # the prompts: the real forward
            logits = self.real(seqs, argmax_vocab)
            narrow = logits.dim() == 2 and self.logits.shape[1] < logits.shape[1]
            return logits[:, : self.logits.shape[1]] if narrow else logits
        self.inputs.fill(seqs, len(seqs), self.prev_tokens)
        return self.logits[: len(seqs)].clone()  # fresh, as a step's: grammar masks go in


DRAW = "keyed"  # the sampler's draw (--draw)
PROMPT_LEN = 20  # --prompt-len
OUT_ROOM = 600  # positions past the prompt a run reaches (its warm-up and steps, with room)


def _max_blocks() -> int:
    """The decode graphs' table width: a row's blocks at the longest context a run reaches."""
    return max(64, -(-(PROMPT_LEN + OUT_ROOM) // 16))


def _launch_stand_in(logits, draw, params, keys):
    """The GPU's draw (triton_sample.sample_rows_keyed) as the host sees it: one launch,
    here one op (its device work is not the host's): greedy's own (`max`), where torch's
    CPU `argmax`, a scalar loop, added ~1,000 instructions a row of device work to the
    count until the twenty-second session (docs/benchmarks.md, "A step's outputs as
    columns")."""
    return greedy_tokens(logits)


def _masks_stand_in(isa, logits, rows, words):
    """triton_masks.mask_rows as the host sees it: one launch (the C++ kernels' one op)."""
    torch.ops.zeroserve.token_bitmask_(logits, rows.tolist(), words.unbind(0), isa)


def publisher(engine: LLMEngine):
    """SchedulerWorker.publish over a stand-in worker: the message encoded, not sent."""
    fake = SimpleNamespace(
        requests={},
        unannounced=set(),
        engine=engine,
        step_no=0,
        replica=0,
        inbox_ep="ipc://bench",
        to_detok=SimpleNamespace(put=lambda msg, timeout_ms=None: encode(msg)),
        ipc_time=0.0,
    )
    return lambda outputs: SchedulerWorker.publish(fake, outputs)  # type: ignore[arg-type]


def engine_for(model_dir: Path, rows: int, kernels: str = "auto", mix: str = "greedy"):
    """The engine as a GPU's host runs it at `rows` rows: overlapped, its forward a graph's
    staging (GraphLike), its sampler the GPU's (module doc); KV blocks for PROMPT_LEN."""
    cfg = EngineConfig(
        model=ModelConfig(model=str(model_dir), dtype="float32", kernels=kernels),
        cache=CacheConfig(
            block_size=16, num_blocks=rows * (40 + PROMPT_LEN // 16) + 64, kv_cache_dtype="float32"
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=rows,
            max_num_batched_tokens=max(2048, rows),
            async_scheduling="on",
            speculative_method="none",  # the plain decode step's host work
        ),
    )
    engine = LLMEngine(cfg, model_dir)
    vocab = engine.vocab_size if mix == "chat" else VOCAB
    engine.runner.execute = GraphLike(engine, rows, vocab)  # type: ignore[method-assign]
    if mix == "chat-narrow-json":  # its arrays open a string and stay in it, as the chat
        # mix's notes run on: the quote and the close far below the other byte tokens
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).token_to_id
        engine.runner.execute.logits[:, ids('"')] -= 16.0
        engine.runner.execute.logits[:, ids("]")] -= 24.0
    # the sampler as on a GPU (not draws.py's CPU op): its draw the keyed Triton launch (a
    # stand-in op: the host pays the launch), its penalties and masks one launch each too
    # (C++ ops for triton_penalties' and triton_masks'); --draw torch: the torch path's ops
    engine.sampler.kernel_isa = None
    if DRAW == "keyed":
        engine.sampler.draw_rows = DrawRows(_launch_stand_in, keyed=True, device="cpu")
        engine.sampler.penalize_rows = CPU_PENALIZE if load_kernels() else None
        if load_kernels():
            engine.sampler.mask_rows = MaskRows(partial(_masks_stand_in, isa_index(best_isa())))
    return engine


def start_requests(engine: LLMEngine, publish, rows: int, mix: str, prompt_len: int) -> None:
    """`rows` requests of prompt_len tokens, stepped until each decodes, then 10 steps."""
    rng = random.Random(0)
    greedy = SamplingParams(max_tokens=480, temperature=0.0, ignore_eos=True)
    for i in range(rows):
        if mix == "greedy":
            params = greedy
        elif mix == "chat-narrow-json":
            params = chat_mix(i, schema=BYTES_SCHEMA)
        else:
            params = chat_mix(i, grammar=mix == "chat")
        narrow = mix.startswith("chat-narrow")
        ids = (1, VOCAB) if narrow else (100, 1000)  # inside the narrow logits
        engine.add_request(f"r{i}", [rng.randrange(*ids) for _ in range(prompt_len)], params)
    while any(r.num_output_tokens < 2 for r in engine.requests.values()):
        publish(engine.step_rows())
    for _ in range(10):
        publish(engine.step_rows())


def run(
    model_dir: Path,
    rows: int,
    steps: int,
    profile: bool,
    kernels: str = "auto",
    mix: str = "greedy",
    count: bool = False,
    ops: list | None = None,
) -> tuple[float, float, float, tuple[float, float] | None, float]:
    """Seconds a step, a row (the rows each step decoded, counted: a grammar's JSON may
    end before max_tokens), a step in the sampler (on a CPU its torch ops are the
    device's work: the chat mix's top-p over the vocabulary is most of them), and with
    `count` the bytecodes and calls a row a step (else None), and the thread's CPU
    seconds a row (the measure of `chat-narrow`). `ops`: count_ops' figures appended."""
    engine = engine_for(model_dir, rows, kernels, mix)
    before = collector.settle()  # as a served worker once ready (WorkerShell.start)
    publish = publisher(engine)
    start_requests(engine, publish, rows, mix, PROMPT_LEN)
    t, cpu, num_rows, sampler = time.perf_counter(), time.thread_time(), 0, 0.0
    for _ in range(steps):
        publish(engine.step_rows())
        num_rows += engine.last_step.num_decode
        sampler += engine.last_step.sample
    seconds = time.perf_counter() - t
    row_cpu = (time.thread_time() - cpu) / max(1, num_rows)
    counted = bytecodes(engine, publish, min(steps, 20)) if count else None
    if ops is not None:
        ops.append(count_ops(engine, publish, min(steps, 20)))
    if profile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            publish(engine.step_rows())
        pr.disable()
        pstats.Stats(pr).sort_stats(os.environ.get("ZS_SORT", "tottime")).print_stats(25)
    collector.restore(before)
    return seconds / steps, seconds / max(1, num_rows), sampler / steps, counted, row_cpu


def main() -> None:
    global DRAW, PROMPT_LEN, VOCAB
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[32, 128, 256])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--ops", action="store_true", help="also the torch ops a step")
    ap.add_argument(
        "--mix",
        choices=("greedy", "chat", "chat-narrow", "chat-narrow-json"),
        default="greedy",
        help="sampling options",
    )
    ap.add_argument(
        "--draw",
        choices=("keyed", "torch"),
        default="keyed",
        help="the sampler's draw: the GPU backend's one launch (a stand-in op), or the torch "
        "path's ops (the figures before the fifteenth session)",
    )
    ap.add_argument("--model", type=Path, help="a model directory (default: a tiny llama)")
    ap.add_argument(
        "--kernels", default="auto", help="the prompts' forward: auto, or torch (no C++ build)"
    )
    ap.add_argument("--prompt-len", type=int, default=20, help="tokens a prompt (default 20)")
    ap.add_argument(
        "--width",
        type=int,
        default=VOCAB,
        help=f"the stand-in logits' width for greedy and chat-narrow (default {VOCAB}): "
        "narrower, the CPU computes less of the sampler's device work",
    )
    args = ap.parse_args()
    if not 2 <= args.width <= 1000:
        ap.error("--width must be 2-1000 (the prompts' token ids lie below it)")
    if args.mix == "chat-narrow-json" and args.width < BYTE_TOKENS:
        ap.error(f"--mix chat-narrow-json needs --width {BYTE_TOKENS} or more (its byte tokens)")
    DRAW, PROMPT_LEN, VOCAB = args.draw, args.prompt_len, args.width
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:  # with the default model's tokenizer (a grammar needs one)
            from common.model_files.model_source import resolve_model
            from tests.conftest import copy_tokenizer_files, make_tiny_model

            model_dir = make_tiny_model("llama", Path(tmp) / "tiny-llama")
            copy_tokenizer_files(resolve_model("smollm2"), model_dir)
            fit_positions(model_dir, PROMPT_LEN + OUT_ROOM)
        print(f"prompts of {PROMPT_LEN} tokens, stand-in logits {VOCAB} wide")
        for rows in args.rows:
            # the chat mix's host figure: its bytecodes at greedy's µs a bytecode (module doc)
            count = args.mix == "chat" or bool(os.environ.get("ZS_BYTECODES"))
            ops: list | None = [] if args.ops else None
            step, row, sampler, counted, row_cpu = run(
                model_dir, rows, args.steps, args.profile, args.kernels, "greedy", count, ops
            )
            greedy_line = (
                f"rows {rows:4d} (greedy): {step * 1e6:8.0f} µs a step, "
                f"{row * 1e6:6.2f} µs a row; sampler {sampler * 1e6:6.0f} µs a step"
            )
            if counted:  # load-free: a shared machine's clock is not
                greedy_line += f"; {counted[0]:.0f} bytecodes, {counted[1]:.2f} calls a row"
            print(greedy_line)
            if ops is not None and args.mix != "greedy":
                run(model_dir, rows, 20, False, args.kernels, args.mix, False, ops)
            if ops:
                print(
                    f"rows {rows:4d}: torch ops a step (of them views): "
                    + ", ".join(
                        f"{m} {o:.0f} ({v:.0f})" for m, (o, v) in zip(("greedy", args.mix), ops)
                    )
                )
            if args.mix == "greedy":
                continue
            if args.mix == "chat-narrow":  # thread CPU, greedy's and the mix's, alternated
                narrow(model_dir, rows, args, row_cpu)
                continue
            if args.mix == "chat-narrow-json":  # with and without its grammar rows
                narrow(model_dir, rows, args, None, ("chat-narrow-json", "chat-narrow"))
                continue
            assert counted is not None
            per_bytecode = row / counted[0]
            step, row, sampler, chat, _ = run(
                model_dir, rows, args.steps, args.profile, args.kernels, "chat", True
            )
            assert chat is not None
            print(
                f"rows {rows:4d} (chat):   {step * 1e6:8.0f} µs a step, "
                f"{row * 1e6:6.2f} µs a row; sampler {sampler * 1e6:6.0f} µs a step; "
                f"{chat[0]:.0f} bytecodes, {chat[1]:.2f} calls a row; host "
                f"(bytecodes x greedy's {per_bytecode * 1e9:.1f} ns each) "
                f"{chat[0] * per_bytecode * 1e6:6.2f} µs a row"
            )


def fit_positions(model_dir: Path, positions: int) -> None:
    """The tiny model's config made to take contexts of `positions` tokens (its own 512
    would refuse a long --prompt-len)."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    config["max_position_embeddings"] = max(config["max_position_embeddings"], positions)
    path.write_text(json.dumps(config))


def narrow(
    model_dir: Path,
    rows: int,
    args: argparse.Namespace,
    other_cpu: float | None,
    mixes: tuple[str, str] = ("chat-narrow", "greedy"),
) -> None:
    """The chat mix without its grammar rows, on logits VOCAB (--width) wide, timed by the
    thread's CPU (OMP_NUM_THREADS=1: torch's ops and the grammar masks' fill run on this
    thread). Its sampler's torch ops then cost little more than their dispatch, which a
    GPU's host pays too: the figure is the host's time (an upper bound: the CPU computes
    the narrow ops). `mixes`: the mix and the one it alternates with, three times each
    (`other_cpu`: one of the second's runs made), the range of each printed; chat-narrow-
    json's less chat-narrow's fastest run is what its grammar rows add."""
    mix, other = mixes
    cpus: dict[str, list[float]] = {mix: [], other: [] if other_cpu is None else [other_cpu]}
    for i in range(5 if other_cpu is not None else 6):
        m = mix if i % 2 == 0 else other
        cpus[m].append(run(model_dir, rows, args.steps, False, args.kernels, m)[4])
    c, g = (sorted(v) for v in cpus.values())
    line = (
        f"rows {rows:4d} ({mix}): thread CPU {c[0] * 1e6:.2f}-{c[-1] * 1e6:.2f} µs a row; "
        f"{other}'s {g[0] * 1e6:.2f}-{g[-1] * 1e6:.2f} (three runs each, alternated)"
    )
    if mix == "chat-narrow-json":
        line += (
            f"; its grammar rows' share {(c[0] - g[0]) * 1e6:+.2f} µs a row (fastest less fastest)"
        )
    print(line)


if __name__ == "__main__":
    main()
