"""launch.py as a process supervisor: restarts, clean SIGTERM, no orphans, clear errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.e2e.conftest import REPO, free_port, start_server

pytestmark = pytest.mark.timeout(180)


def wait_for(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := cond():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def complete(server, prompt: str = "Hello", n: int = 4) -> str:
    r = httpx.post(
        server.url + "/v1/completions",
        timeout=60,
        json={"prompt": prompt, "max_tokens": n, "ignore_eos": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == n
    return r.json()["choices"][0]["text"]


def worker_pids(server, module: str) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-f", "--", f"-m {module} --config {server.run_dir}"],
        capture_output=True,
        text=True,
    )
    return [int(p) for p in out.stdout.split()]


def test_dead_tokenizer_is_replaced_and_sigterm_stops_everything(default_model_dir):
    server = start_server(workers=2)
    try:
        complete(server)
        children = server.pids()
        assert len(children) == 5, children  # scheduler, detok, 2 tokenizers, frontend
        victim = worker_pids(server, "tokenizer_worker")[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: len(set(worker_pids(server, "tokenizer_worker")) - {victim}) == 2,
            15,
            "a replacement tokenizer worker",
        )
        wait_for(
            lambda: httpx.get(server.url + "/health", timeout=5).status_code == 200, 15, "health"
        )
        for i in range(4):  # the pool spreads these over both workers, the new one included
            complete(server, f"Request {i}")
        assert "tokenizer-" in server.log() and "restarting" in server.log()
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0, server.log()[-3000:]
    assert server.pids() == [], "children outlived launch.py"


def test_kill_9_of_launcher_takes_children_along(default_model_dir):
    server = start_server(workers=1)
    children = server.pids()
    assert len(children) == 4
    server.proc.kill()
    server.proc.wait()
    wait_for(lambda: server.pids() == [], 10, "children to die with their parent")


def test_bad_model_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model.gguf"
    r = subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "--model", str(missing), "--port", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2
    assert str(missing) in r.stderr


def test_sigterm_during_model_conversion_stops_cleanly(tmp_path):
    """Stopping launch.py while it converts the GGUF (a fresh cache): exit 0, no traceback,
    no half-written conversion left to be mistaken for a complete one, run dir removed."""
    cache, runtime = tmp_path / "cache", tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "ZEROSERVE_CACHE_DIR": str(cache), "XDG_RUNTIME_DIR": str(runtime)}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "launch.py"), "--port", str(free_port())],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: cache.is_dir() and any(p.is_dir() for p in cache.iterdir()),
            60,
            "the conversion to start",
        )
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert not [p for p in cache.iterdir() if p.is_dir()], "conversion left behind"
    assert list(runtime.iterdir()) == [], "run dir left behind"


def test_kill_9_during_model_conversion_takes_the_converter_along(tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "ZEROSERVE_CACHE_DIR": str(cache)}
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "launch.py"), "--port", str(free_port())],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def converters() -> list[int]:
        out = subprocess.run(
            ["pgrep", "-f", "--", f"common.model_files.gguf_convert .* {cache}/"],
            capture_output=True,
            text=True,
        )
        return [int(p) for p in out.stdout.split()]

    try:
        wait_for(converters, 60, "the conversion to start")
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: converters() == [], 10, "the converter to die with launch.py")


def test_gguf_quantization_of_an_hf_directory_is_refused_before_any_child_starts(tiny_model_dirs):
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch.py"),
            "--model",
            str(tiny_model_dirs["llama"]),
            "--quantization",
            "gguf",
            "--port",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2, r.stderr
    assert "launch.py: --quantization gguf needs a GGUF model" in r.stderr
    assert "Traceback" not in r.stderr and "scheduler" not in r.stderr.lower()


def test_int4_server_answers_and_bad_quantization_is_a_clear_error(default_model_dir):
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "launch.py"),
            "--quantization",
            "int4",
            "--dtype",
            "float16",
            "--port",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and "quantization 'int4' runs on the CPU" in r.stderr
    server = start_server(
        "--dtype", "bfloat16", "--device", "cpu", "--quantization", "int4", workers=1
    )
    try:
        r = httpx.post(
            server.url + "/v1/chat/completions",
            timeout=60,
            json={
                "model": "smollm2",
                "max_tokens": 16,
                "temperature": 0,
                # "Answer in one word." keeps the answer off a near-tie: without it the first
                # token is "The" or "L" by 0.08 logits, and 8-bit activations (as llama.cpp's
                # on the same GGUF) pick "L'Étoile, ..."
                "messages": [
                    {
                        "role": "user",
                        "content": "What is the capital of France? Answer in one word.",
                    }
                ],
            },
        )
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["choices"][0]["message"]["content"]
        assert "weights: 121 linears quantized to int4 blocks" in server.log()
    finally:
        assert server.stop() == 0, server.log()[-4000:]
