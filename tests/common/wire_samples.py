"""One sample of every wire message, and raw frames built by hand, for the wire tests
(test_messages.py, test_messages_malformed.py)."""

from __future__ import annotations

import dataclasses

import msgpack

from common.messages import (
    WIRE_VERSION,
    AbortRequest,
    ComponentStatus,
    EngineStatus,
    GenerateRequest,
    Message,
    RequestError,
    StepOutputs,
    TextOutputs,
    TokenizerCall,
    TokenizeRequest,
    TokenizerReply,
    encode,
    pack_ids,
)
from common.messages.scheduler_detok import packed_columns
from common.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=8, stop=["\n"], seed=3)


def step_outputs(
    step: int,
    rids: list[str],
    new_token_ids: list[bytes],
    finish_reasons: list,
    num_prompt_tokens: list[int],
    num_output_tokens: list[int],
    logprobs: list | None,
    new_requests: list,
    timings: list | None,
    sent_time: float,
    stop_token_ids: list | None = None,
    prompt_logprobs: list | None = None,
    **fields,
) -> StepOutputs:
    """A StepOutputs from its columns as lists, a row's tokens pack_ids'd (the integer
    columns packed here, as on the wire)."""
    cols = {
        "rids": rids,
        "new_token_ids": new_token_ids,
        "finish_reasons": finish_reasons,
        "num_prompt_tokens": num_prompt_tokens,
        "num_output_tokens": num_output_tokens,
        "logprobs": logprobs,
        "timings": timings,
        "stop_token_ids": stop_token_ids,
        "prompt_logprobs": prompt_logprobs,
    }
    return StepOutputs(
        step=step,
        new_requests=new_requests,
        sent_time=sent_time,
        **packed_columns(cols),
        **fields,
    )


IDS = pack_ids([0, 1, 49151, 2**31 - 1])


SAMPLES: list[Message] = [
    TokenizeRequest("r1", "completion", "Hello 你好 🎉", None, None, PARAMS),
    TokenizeRequest(
        "r2",
        "completion",
        None,
        IDS,
        None,
        SamplingParams(max_tokens=None, max_tokens_cap=16),
        4321,
    ),
    TokenizeRequest(
        "r3",
        "chat",
        None,
        None,
        [{"role": "user", "content": "hi"}, {"role": "system", "content": ""}],
        PARAMS,
        1,
    ),
    TokenizeRequest(  # chat with tools (frontend.tools.request)
        "r4",
        "chat",
        None,
        None,
        [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}],
        PARAMS,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
    ),
    GenerateRequest("r1", IDS, PARAMS, 2.0, 4321),
    GenerateRequest("", b"", SamplingParams(), 0.0),
    AbortRequest("r1", "client_disconnect"),
    StepOutputs(
        7,
        ["a", "b"],
        pack_ids([5]),
        pack_ids([1, 0]),
        [None, "abort"],
        pack_ids([3, 4]),
        pack_ids([1, 0]),
        [[[-0.5, [[5, -0.5], [6, -1.25]]]], None],
        [("a", ["</s>", "\n\n"], True, False, 0, 0), ("b", [], False, True, 0, 0)],
        [{"arrival": 1.0, "first_token": 2.5}, None],
        123.25,
    ),
    StepOutputs(0, [], b"", None, None, b"", b"", None, [], None, 0.0),
    EngineStatus("ready", 0, 0, 0.0, 100, 100, 0, 0, "smollm2", 8192, 49152, 1.0),
    EngineStatus("heartbeat", 3, 1, 0.25, 75, 100, 640, 320, "m", 2048, 512, 2.0),
    EngineStatus(
        "heartbeat",
        3,
        1,
        0.25,
        75,
        100,
        640,
        320,
        "m",
        2048,
        512,
        2.0,
        {"forward": 1.5, "sample": 0.25, "schedule": 0.0, "ipc": 0.125},
        device="NVIDIA H200",
        gpus=["2", "3"],
    ),
    TextOutputs(
        ["a", "b"],
        ["Hé", ""],
        ["stop", None],
        [3, 4],
        [2, 1],
        [IDS, b""],
        None,
        None,
        ["\n", None],
        5.0,
    ),
    TextOutputs([], [], [], [], [], [], [], [], [], 0.0),
    RequestError("r9", 400, "max_tokens: must be >= 1", "invalid_request_error", "max_tokens"),
    RequestError("r9", 500, "", "internal_error", None),
    ComponentStatus("detok", 1234, "stopping", 3.0),
    ComponentStatus("tokenizer", 77, "ready", 3.0, ("smollm2", 49152, 8192, 0)),
    TokenizerCall("c1", "tokenize", {"prompt": "Hé", "add_special_tokens": True}),
    TokenizerReply("c1", 200, {"count": 2, "tokens": [1, 2], "token_strs": None}),
    TokenizerReply("c2", 400, {"message": "tokens: bad", "param": "tokens"}),
    StepOutputs(
        1,
        ["a"],
        pack_ids([5]),
        None,
        None,
        pack_ids([2]),
        pack_ids([1]),
        None,
        [],
        None,
        1.0,
        None,
        [[[7, None, []], [8, -0.5, [[8, -0.5], [9, -1.0]]]]],
    ),
]


def raw(*items) -> bytes:
    return msgpack.packb(list(items), use_bin_type=True)


def fields_of(msg: Message) -> list:
    return [getattr(msg, f.name) for f in dataclasses.fields(msg)]


GOOD_ABORT = [WIRE_VERSION, AbortRequest.TAG, "rid", "why"]


WIRE_PARAMS = msgpack.unpackb(encode(GenerateRequest("r", b"", SamplingParams(), 0.0)))[4]


ENGINE_FIELDS = ["ready", 0, 0, 0.0, 1, 1, 0, 0, "m", 16, 32, 0.0, {}, 0, 1, None, None, 0, 16, {}]


ENGINE_FIELDS += ["NVIDIA H200", ["2"]]  # device, gpus
ENGINE_FIELDS += [{"verify_steps": 3}, "ngram"]  # spec, spec_method
