"""The tokenizer endpoints' answers with the default model's tokenizer, against
transformers, and a TokenizerCall through a worker (its reply to the frontend)."""

from __future__ import annotations

import pytest

from common.messages import TokenizerCall, TokenizerReply
from tests.tokenizer_worker.conftest import CONVERSATIONS, hf_chat_ids
from tokenizer_worker.endpoints import TokenizerEndpoints
from tokenizer_worker.tokenization import Rejected


@pytest.fixture(scope="module")
def ep(tok, default_model_dir) -> TokenizerEndpoints:
    return TokenizerEndpoints(tok, default_model_dir)


def test_tokenize_as_transformers(ep, hf_tok):
    text = "The café costs 5€ — 你好"
    out = ep("tokenize", {"prompt": text, "add_special_tokens": True, "return_token_strs": True})
    assert out["tokens"] == hf_tok(text)["input_ids"] and out["count"] == len(out["tokens"])
    assert out["token_strs"] == hf_tok.convert_ids_to_tokens(out["tokens"])
    assert out["max_model_len"] == ep.t.max_model_len
    messages = CONVERSATIONS["system+user"]
    out = ep("tokenize", {"messages": messages, "add_generation_prompt": True})
    assert out["tokens"] == hf_chat_ids(hf_tok, messages) and out["token_strs"] is None
    # round trip, special tokens kept (as vLLM)
    back = ep("detokenize", {"tokens": out["tokens"]})["prompt"]
    assert back == hf_tok.decode(out["tokens"])
    assert back.startswith("<|im_start|>system")


def test_detokenize_refuses_ids_outside_the_vocabulary(ep):
    for bad in ([-1], [ep.t.vocab_size], [1, 2**40]):
        with pytest.raises(Rejected) as e:
            ep("detokenize", {"tokens": bad})
        assert e.value.status == 400 and e.value.param == "tokens"


def test_tokenizer_info(ep, hf_tok):
    info = ep("tokenizer_info", {})
    assert info["eos_token"] == hf_tok.eos_token and info["bos_token"] == hf_tok.bos_token
    assert info["chat_template"] == hf_tok.chat_template
    assert info["max_model_len"] == ep.t.max_model_len
    assert isinstance(info["tokenizer_class"], str) and info["vocab_size"] == ep.t.vocab_size


def test_a_worker_answers_a_call(tok, run_dir):
    from common.config import Config, IPCConfig
    from common.zmq_queue import PullQueue
    from tokenizer_worker.worker import TokenizerWorker

    config = Config(ipc=IPCConfig(run_dir=str(run_dir)))
    inbox = PullQueue(config.ipc.endpoint("frontend"), bind=True)
    worker = TokenizerWorker(config, tok)
    try:
        worker.handle(TokenizerCall("c1", "tokenize", {"prompt": "Hi", "add_special_tokens": True}))
        worker.handle(TokenizerCall("c2", "detokenize", {"tokens": [-5]}))
        replies = []
        while len(replies) < 2:
            replies += [
                m for m in inbox.get_batch(timeout_ms=2000) if isinstance(m, TokenizerReply)
            ]
        ok, bad = replies
        assert (ok.call_id, ok.status) == ("c1", 200) and ok.body["tokens"] == tok.tokenizer.encode(
            "Hi"
        ).ids
        assert (bad.call_id, bad.status, bad.body["param"]) == ("c2", 400, "tokens")
        assert worker.num_done == 0  # calls are not requests: nothing went to the scheduler
    finally:
        worker.shell.close()
        inbox.close()
