"""--load-format dummy end to end: launch.py serves a directory holding only config.json and
a tokenizer (random weights made in the scheduler), through the openai client; what cannot
work is refused in one line before any component starts."""

from __future__ import annotations

import subprocess
import sys

import openai
import pytest

from tests.e2e.conftest import REPO, served
from tests.scheduler_worker.test_dummy_weights import config_only

pytestmark = pytest.mark.timeout(180)


def launch(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "launch.py"), "--port", "1", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def weightless_dir(tiny_llama_dir, tmp_path_factory):
    return config_only(tiny_llama_dir, tmp_path_factory.mktemp("dummy") / "llama")


@pytest.fixture(scope="module")
def dummy_server(weightless_dir):
    yield from served("--model", str(weightless_dir), "--load-format", "dummy", workers=1)


def test_dummy_weights_serve_a_directory_without_weights(dummy_server):
    client = openai.OpenAI(base_url=dummy_server.url + "/v1", api_key="x", max_retries=0)
    texts = []
    for _ in range(2):
        r = client.completions.create(
            model=client.models.list().data[0].id, prompt="The cache holds", max_tokens=8,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert r.usage.completion_tokens == 8
        texts.append(r.choices[0].text)
    assert texts[0] == texts[1] and texts[0].strip()
    assert "weights: random, from config.json (--load-format dummy)" in dummy_server.log()


@pytest.mark.parametrize(
    "argv,line",
    [
        (["--load-format", "dummy"], "--load-format dummy needs a Hugging Face model directory"),
        (["--load-format", "dummy", "--quantization", "gguf"], "quantization gguf"),
    ],
)
def test_refused_in_one_line(argv, line):
    r = launch(*argv)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("launch.py: ") and line in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_directory_without_weights_names_the_flag(weightless_dir):
    r = launch("--model", str(weightless_dir))
    assert r.returncode == 2, r.stderr
    assert "has no *.safetensors weights" in r.stderr and "--load-format dummy" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
