"""A real server: `launch.py` with the default model on a loopback port, all processes.

One server per test session (model load ~5 s); float32 so its greedy output can be
compared with transformers token for token. Tests that kill or stop a server start their
own with `start_server`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from benchmarks.comparison.metrics import parse_metrics

REPO = Path(__file__).resolve().parents[2]
NUM_KV_BLOCKS = 1024  # 16K tokens: plenty for 64 short streams, quick to allocate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    run_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """{name{labels}: value}; a labelled family also summed under its bare name."""
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=5).text)

    def wait_idle(self, timeout_s: float = 10.0) -> dict[str, float]:
        """Wait until the engine reports no running request and every KV block free (the
        scheduler's heartbeat refreshes these figures every second)."""
        deadline = time.monotonic() + timeout_s
        while True:
            m = self.metrics()
            if (
                m.get("zeroserve:num_requests_running") == 0
                and m.get("zeroserve:num_requests_waiting") == 0
                and m.get("zeroserve:kv_cache_free_blocks")
                == m.get("zeroserve:kv_cache_total_blocks")
                and m.get("zeroserve:num_requests_in_flight") == 0
            ):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"engine not idle after {timeout_s} s: "
                    f"{ {k: v for k, v in m.items() if 'num_' in k or 'kv_' in k} }"
                )
            time.sleep(0.2)

    def pids(self) -> list[int]:
        """The launcher's children (found by their shared config file)."""
        out = subprocess.run(
            ["pgrep", "-f", str(self.run_dir / "config.json")], capture_output=True, text=True
        )
        return [int(p) for p in out.stdout.split()]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def start_server(*extra: str, workers: int = 2, timeout_s: float = 120.0) -> Server:
    port = free_port()
    run_dir = Path(tempfile.mkdtemp(prefix="zs-e2e-", dir="/tmp"))
    log_path = run_dir.parent / f"{run_dir.name}.log"
    args = [
        sys.executable,
        str(REPO / "launch.py"),
        "--port",
        str(port),
        "--tokenize-workers",
        str(workers),
        "--run-dir",
        str(run_dir),
        "--dtype",
        "float32",
        "--num-kv-blocks",
        str(NUM_KV_BLOCKS),
        *extra,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    server = Server(proc, port, run_dir, log_path)
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"launch.py exited with {proc.returncode}:\n{server.log()}")
        # the launcher's own word: past startup (a child that dies now is restarted)
        if "zeroserve ready:" in server.log():
            return server
        if time.monotonic() > deadline:
            server.stop(signal.SIGKILL)
            raise RuntimeError(f"server not healthy after {timeout_s} s:\n{server.log()}")
        time.sleep(0.2)


def served(*extra: str, workers: int = 2) -> Iterator[Server]:
    """A fixture's server (`yield from served(...)`): start_server(*extra, workers=...),
    and at teardown SIGTERM, which must end launch.py with 0 and leave no process."""
    server = start_server(*extra, workers=workers)
    yield server
    code = server.stop()
    assert code == 0, server.log()[-4000:]
    assert server.pids() == []


@pytest.fixture(scope="session")
def server(default_model_dir):
    yield from served()


@pytest.fixture(scope="session")
def float_server(default_model_dir):
    """A second server: dequantized float32 weights and a float32 KV cache (what
    transformers computes with, so prompt logprobs compare with it at 1e-3) and
    --stream-interval 8."""
    yield from served(
        "--quantization", "none", "--kv-cache-dtype", "float32", "--stream-interval", "8", workers=1
    )


@pytest.fixture(scope="package")
def ngram_server(default_model_dir):
    """A server with ngram drafts on every request that asks (the speculation tests:
    test_spec_serving.py, test_spec_sampled_serving.py, test_spec_structured.py)."""
    yield from served(
        "--speculative-method",
        "ngram",
        "--num-speculative-tokens",
        "4",
        "--speculative-policy",
        "always",  # the counts asserted are the drafter's: the adaptive fit may drop drafts
        workers=1,
    )


@pytest.fixture(scope="module")
def pids_before(server) -> list[int]:
    """The server's processes when a module starts (the server is shared with the rest
    of the session, so the snapshot is taken here, not at launch)."""
    pids = sorted(server.pids())
    assert len(pids) >= 5, pids  # frontend, 2 tokenizers, scheduler, detok
    return pids


# the chats the serving tests send (tests/e2e/test_serving*.py)
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primary colors."},
    ],
]


def chat_ids(tokenizer, messages) -> list[int]:
    """The prompt token ids of `messages` under the tokenizer's chat template."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.fixture(scope="module")
def client(server):
    """The official openai client on the shared server (a module may define its own)."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    """The default model's tokenizer, as transformers loads it."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(default_model_dir)
