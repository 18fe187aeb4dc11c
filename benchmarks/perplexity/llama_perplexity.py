"""llama.cpp's `llama-perplexity` on a GGUF file and a text file: run it, read its result.

Its output (stderr and stdout together) has the lines this reads:

    perplexity: calculating perplexity over 19 chunks, n_ctx=512, batch_size=2048, n_seq=4
    [1]12.3456,[2]13.0101,...
    Final estimate: PPL = 13.1234 +/- 0.41234
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_RUNNING = re.compile(r"\[(\d+)\]([0-9.]+|nan|inf),")


@dataclass(frozen=True)
class LlamaPerplexity:
    ppl: float
    stderr: float
    num_chunks: int
    n_ctx: int
    running: list[float]  # PPL after each chunk, as printed


def parse_output(text: str) -> LlamaPerplexity:
    final = _FINAL.search(text)
    chunks = _CHUNKS.search(text)
    if final is None or chunks is None:
        tail = text[-1500:]
        raise ValueError(f"no 'Final estimate: PPL = ...' in llama-perplexity's output:\n{tail}")
    running = [float(v) for _, v in _RUNNING.findall(text)]
    return LlamaPerplexity(
        ppl=float(final.group(1)),
        stderr=float(final.group(2)),
        num_chunks=int(chunks.group(1)),
        n_ctx=int(chunks.group(2)),
        running=running,
    )


def command(
    binary: str, gguf: str, text_file: str, n_ctx: int, num_chunks: int | None, threads: int
) -> list[str]:
    argv = [binary, "-m", gguf, "-f", text_file, "-c", str(n_ctx), "-t", str(threads)]
    if num_chunks:
        argv += ["--chunks", str(num_chunks)]
    return argv


def run(argv: list[str], timeout_s: float = 3600.0) -> tuple[LlamaPerplexity, str]:
    """(the parsed result, the whole output); a failed run raises with its output's tail."""
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
    )
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} exited with {proc.returncode}:\n{out[-1500:]}")
    return parse_output(out), out
