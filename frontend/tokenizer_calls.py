"""Calls of the tokenizer endpoints in flight: TokenizerCall out, TokenizerReply back.

```
 /tokenize handler ──call()──▶ TokenizerCall ──▶ tokenizer pool ──TokenizerReply──▶ inbox
        ▲                                                                            │
        └──────────── future, by call id ◀── on_reply() (dispatch, on the loop) ◀───┘
```
A call is not a generation request: it holds no route, no handle and no scheduler
work. A worker that dies with one leaves it to the timeout (a 504).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from common.messages import TokenizerCall, TokenizerReply
from frontend.errors import APIError

CALL_TIMEOUT_S = 30.0  # at most; server.request_timeout_s when shorter


class TokenizerCalls:
    def __init__(
        self,
        send: Callable[[TokenizerCall], Awaitable[object]],
        timeout_s: float,
        frontend: int = 0,
    ) -> None:
        self._send = send
        self.frontend = frontend  # this frontend's id: the worker answers to its inbox
        self.timeout_s = min(CALL_TIMEOUT_S, timeout_s)
        self.pending: dict[str, asyncio.Future[TokenizerReply]] = {}

    async def call(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """The worker's answer; APIError with its status (400: bad input), 504 on timeout."""
        call_id = uuid.uuid4().hex
        fut: asyncio.Future[TokenizerReply] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = fut
        try:
            await self._send(TokenizerCall(call_id, op, args, self.frontend))
            reply = await asyncio.wait_for(fut, self.timeout_s)
        except TimeoutError:  # TimeoutError itself from 3.11 on
            raise APIError(
                504,
                f"no tokenizer worker answered within {self.timeout_s:g} s",
                "server_error",
                None,
                "timeout",
            ) from None
        finally:
            self.pending.pop(call_id, None)
        if reply.status != 200:
            status = reply.status if 400 <= reply.status <= 599 else 500
            message = reply.body.get("message")
            param = reply.body.get("param")
            err_type = "invalid_request_error" if status < 500 else "server_error"
            raise APIError(
                status,
                message if isinstance(message, str) else "tokenizer call failed",
                err_type,
                param if isinstance(param, str) else None,
            )
        return reply.body

    def on_reply(self, msg: TokenizerReply) -> None:
        fut = self.pending.get(msg.call_id)
        if fut is not None and not fut.done():
            fut.set_result(msg)
