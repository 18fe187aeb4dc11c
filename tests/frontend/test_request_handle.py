"""RequestHandle.next(): a consumer that keeps up gets each step's output on its own; one
that fell behind gets the waiting outputs of a choice merged into one Delta (text, token
ids and logprobs in order, the last counts and finish), with other choices' outputs and
errors left in their order."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.messages import pack_ids
from frontend.api.openai_format import Choice, CompletionFormat
from frontend.errors import APIError
from frontend.logprobs import token_logprobs
from frontend.request_handle import Delta, RequestHandle


def delta(index, text, n_out, tid, finish=None, lp=None, prompt_lps=None, cached=0):
    return Delta(
        index,
        text,
        finish,
        None,
        7,
        n_out,
        pack_ids([tid]),
        None if lp is None else [[lp, [[tid, lp]], [text, text]]],
        None,
        prompt_lps,
        cached,
    )


def handle(n=1) -> RequestHandle:
    return RequestHandle([f"r-{i}" for i in range(n)], time.monotonic(), 60.0)


def drain(h: RequestHandle) -> list[Delta]:
    async def go():
        out = []
        while not h.done:
            out.append(await asyncio.wait_for(h.next(), 2))
        return out

    return asyncio.run(go())


def test_a_consumer_that_keeps_up_gets_each_output_alone():
    h = handle()

    async def go():
        got = []
        for i, text in enumerate(["a", "b", "c"]):
            h.queue.put_nowait(delta(0, text, i + 1, 10 + i, "stop" if i == 2 else None))
            got.append(await h.next())
        return got

    got = asyncio.run(go())
    assert [d.text for d in got] == ["a", "b", "c"]
    assert [d.num_output_tokens for d in got] == [1, 2, 3]
    assert h.done


def test_waiting_outputs_of_a_choice_become_one():
    h = handle()
    first = delta(0, "He", 1, 10, lp=-0.5, prompt_lps=[None, [-1.0, []]])
    h.queue.put_nowait(first)
    h.queue.put_nowait(delta(0, "llo", 2, 11, lp=-0.25))
    h.queue.put_nowait(delta(0, "!", 3, 12, "stop", lp=-0.125, cached=16))
    (d,) = drain(h)
    assert d.text == "Hello!"
    assert d.finish_reason == "stop" and d.num_output_tokens == 3 and d.num_cached_tokens == 16
    assert d.prompt_logprobs == first.prompt_logprobs
    # token ids and logprobs stay aligned, token by token
    assert [(t, lp) for t, lp, _ in token_logprobs(d)] == [
        ("He", -0.5),
        ("llo", -0.25),
        ("!", -0.125),
    ]
    assert h.num_finished == 1


def test_choices_merge_apart_and_keep_their_order():
    h = handle(2)
    for item in [
        delta(0, "a", 1, 1),
        delta(1, "x", 1, 2),
        delta(0, "b", 2, 3),
        delta(1, "y", 2, 4, "length"),
        delta(0, "c", 3, 5, "stop"),
    ]:
        h.queue.put_nowait(item)
    got = drain(h)
    assert [(d.index, d.text, d.finish_reason) for d in got] == [
        (0, "abc", "stop"),
        (1, "xy", "length"),
    ]


def test_an_error_is_not_jumped():
    """Outputs queued before an error are delivered (merged), then the error is raised:
    nothing behind it is merged past it."""
    h = handle()
    h.queue.put_nowait(delta(0, "a", 1, 1))
    h.queue.put_nowait(delta(0, "b", 2, 2))
    h.queue.put_nowait(APIError(500, "boom"))
    h.queue.put_nowait(delta(0, "c", 3, 3))

    async def go():
        d = await h.next()
        with pytest.raises(APIError):
            await h.next()
        return d

    assert asyncio.run(go()).text == "ab"


def test_outputs_that_cannot_join_stay_apart():
    """A finished output takes nothing after it; logprobs on one side only, or prompt
    logprobs on the later one, stop the merge."""
    h = handle()
    h.queue.put_nowait(delta(0, "a", 1, 1, lp=-1.0))
    h.queue.put_nowait(delta(0, "b", 2, 2))  # no logprobs: cannot join "a"
    h.queue.put_nowait(delta(0, "c", 3, 3, "stop"))
    got = drain(h)
    assert [d.text for d in got] == ["a", "bc"]


def test_a_merged_output_is_one_sse_event_with_every_token():
    h = handle()
    for i, text in enumerate(["x", "y", "z"]):
        h.queue.put_nowait(delta(0, text, i + 1, 20 + i, lp=-float(i + 1)))
    h.queue.put_nowait(delta(0, "", 4, 23, "length", lp=-4.0))
    (d,) = drain(h)
    fmt = CompletionFormat("cmpl-1", "m", 0, True, False, False)
    choice = Choice(0)
    offset, lps = choice.add(d, keep=False)
    event = fmt.stream_delta(d, offset, lps)
    assert event.count("data: ") == 1
    assert '"text": "xyz"' in event or '"text":"xyz"' in event
    assert len(lps) == 4 and [lp for _, lp, _ in lps] == [-1.0, -2.0, -3.0, -4.0]
