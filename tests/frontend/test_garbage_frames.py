"""No frame a peer can send kills the frontend's inbox (see tests/garbage.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.messages import (
    ComponentStatus,
    EngineStatus,
    RequestError,
    TextOutputs,
    encode,
    pack_ids,
)
from tests.garbage import (
    WAIT_S,
    RawPush,
    make_config,
    malformed,
    misrouted,
)

pytestmark = pytest.mark.timeout(60)


def test_frontend_inbox_survives_garbage(run_dir):
    from frontend.cluster.engine_client import EngineClient
    from frontend.metrics import Metrics
    from frontend.request_handle import Delta, RequestHandle

    config = make_config(run_dir)
    client = EngineClient(config, Metrics())

    async def scenario() -> None:
        client.start()
        push = RawPush(config.ipc.endpoint("frontend"), bind=False)
        try:
            handle = RequestHandle(["r1", "r2"], time.monotonic(), 60.0)
            client.routes.update({"r1": (handle, 0), "r2": (handle, 1)})
            now = time.time()
            frames = malformed(ComponentStatus("detok", 1, "ready", now))
            push.send_all(frames)
            push.send_all(misrouted(TextOutputs, RequestError, EngineStatus, ComponentStatus))
            push.send_all(
                encode(m)
                for m in [
                    TextOutputs(
                        ["r1", "r2"], ["a"], [None], [1], [1], [b""], None, None, [None], now
                    ),
                    TextOutputs(
                        ["r1"], ["a"], [None], [1], [1], [b""], [None, None], None, [None], now
                    ),
                    TextOutputs(
                        ["nobody"], ["a"], ["stop"], [1], [1], [b""], None, None, [None], now
                    ),
                    RequestError("nobody", 400, "x", "invalid_request_error", None),
                    RequestError("r2", 999, "odd status", "server_error", None),
                    EngineStatus("weird", -1, -1, 7.5, -1, 0, -5, -9, "", 0, 0, -1.0),
                    ComponentStatus("martian", -1, "ready", now),
                    ComponentStatus("detok", 4343, "??", now),  # same pid: a new one = restart
                ]
            )
            pack5 = pack_ids([5])
            good = [
                EngineStatus("ready", 0, 0, 0.0, 64, 64, 0, 0, config.model_name, 64, 512, now),
                ComponentStatus("tokenizer", 4242, "ready", now),
                ComponentStatus("detok", 4343, "ready", now),
                TextOutputs(["r1"], ["hi"], ["length"], [2], [1], [pack5], None, None, [None], now),
            ]
            push.send_all(encode(m) for m in good)
            await client.cluster.wait_ready(WAIT_S, stopped=lambda: False)
            first = await asyncio.wait_for(handle.queue.get(), WAIT_S)
            second = await asyncio.wait_for(handle.queue.get(), WAIT_S)
            assert client._thread is not None and client._thread.is_alive()
            # r2 failed with the out-of-range status mapped to 500; r1 got its text
            assert getattr(first, "status", None) == 500
            assert isinstance(second, Delta) and second.text == "hi" and second.index == 0
            assert second.finish_reason == "length" and not client.routes
            assert client._inbox is not None and client._inbox.num_dropped == len(frames)
        finally:
            push.close()
            client.close()

    asyncio.run(scenario())
