"""One request to an OpenAI-compatible server, streamed or not, with its timings:
TTFT, the content chunks' times, the usage counts, or the error."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from benchmarks.serving.mix import chat_mix, check_output, top_logprobs
from benchmarks.serving.prompts import Spec, count_tokens


class RequestFailed(Exception):
    pass


def _headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}


def request_body(
    args: argparse.Namespace, model: str, spec: Spec, index: int = 0
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": spec.output_len,
        "temperature": args.temperature,
        "stream": args.stream,
    }
    if args.endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    if args.stream:
        body["stream_options"] = {"include_usage": True}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if getattr(args, "mix", "greedy") == "chat":  # sampling options by the request's index
        body.update(chat_mix(index, args.endpoint.endswith("/chat/completions")))
    body.update(args.extra_body or {})
    return body


async def fetch_model(client, args: argparse.Namespace) -> str:
    """The first model the server lists (`client`: an aiohttp.ClientSession)."""
    url = args.base_url.rstrip("/") + "/v1/models"
    async with client.get(url, headers=_headers(args)) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"GET /v1/models: HTTP {r.status}: {text[:300]}")
    data = json.loads(text).get("data") or []
    if not data:
        raise RuntimeError("GET /v1/models: no models listed; pass --model")
    return data[0]["id"]


def _content(choice: dict[str, Any], chat: bool, stream: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    msg = choice.get("delta" if stream else "message") or {}
    return msg.get("content") or msg.get("reasoning_content") or msg.get("reasoning") or ""


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


class _Request:
    """One request's measurements; times are perf_counter() values until `record`."""

    def __init__(self, index: int, spec: Spec, scheduled_s: float) -> None:
        self.index, self.spec, self.scheduled_s = index, spec, scheduled_s
        self.sent = self.first = self.end = None
        self.chunk_times: list[float] = []
        self.usage_out: int | None = None
        self.usage_in: int | None = None
        self.error: str | None = None
        self.finished = False
        self.tokens_from = "none"

    @property
    def output_tokens(self) -> int:
        if self.usage_out is not None:
            return self.usage_out
        return len(self.chunk_times)

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def events(self, t0: float) -> list[tuple[float, float]]:
        """(time after t0, tokens) for the time series: usage tokens spread over the chunks."""
        if self.error is not None or self.end is None:
            return []
        n = self.output_tokens
        if self.chunk_times:
            per = n / len(self.chunk_times)
            return [(t - t0, per) for t in self.chunk_times]
        return [(self.end - t0, float(n))] if n else []

    def record(self, t0: float) -> dict[str, Any]:
        ok = self.error is None and self.end is not None
        elapsed = self.end - self.sent if self.end is not None and self.sent is not None else None
        e2e = elapsed if ok else None
        ttft = self.first - self.sent if ok and self.first is not None else None
        out = self.output_tokens if ok else None
        tpot = (e2e - ttft) / (out - 1) if ttft is not None and out and out > 1 else None
        return {
            "index": self.index,
            "success": ok,
            "error": self.error,
            "scheduled_s": self.scheduled_s,
            "sent_s": None if self.sent is None else self.sent - t0,
            "end_s": None if self.end is None else self.end - t0,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "elapsed_s": elapsed,
            "output_tokens": out,
            "output_len": self.spec.output_len,
            "output_tokens_from": self.tokens_from,
            "prompt_tokens": self.usage_in,
            "prompt_len": self.spec.prompt_len,
            "num_chunks": len(self.chunk_times),
        }


async def send_request(
    client, args: argparse.Namespace, url: str, model: str, req: _Request, tokenizer=None
) -> None:
    """Send one request and fill in `req`; never raises (errors go to req.error).
    `client`: an aiohttp.ClientSession (submit.http_client)."""
    chat = args.endpoint.endswith("/chat/completions")
    body = request_body(args, model, req.spec, req.index)
    req.sent = time.perf_counter()
    try:
        async with client.post(url, json=body, headers=_headers(args)) as resp:
            if resp.status != 200:
                text = (await resp.read()).decode("utf-8", "replace")
                raise RequestFailed(f"HTTP {resp.status}: {text[:300]}")
            if args.stream:
                await _read_stream(resp, req, chat, getattr(args, "mix", "greedy") == "chat")
            else:
                _read_reply(json.loads(await resp.read()), req, chat, tokenizer)
        req.end = time.perf_counter()
    except RequestFailed as e:
        req.error = str(e)
    except Exception as e:  # transport errors, bad JSON, timeouts: a failed request
        req.error = f"{type(e).__name__}: {e}"[:400] if str(e) else type(e).__name__
    if req.error is not None:
        req.end = time.perf_counter()


async def _read_stream(resp, req: _Request, chat: bool, checked: bool = False) -> None:
    """The SSE lines of a streamed reply into `req`: each content chunk's arrival time, the
    usage counts; RequestFailed on an error event or a stream cut short, and with `checked`
    (the chat mix) on an output that breaks its checks (mix.check_output)."""
    done = False
    text: list[str] = []
    positions: list[list[float]] = []
    async for raw in _lines(resp):
        if not raw.startswith(b"data:"):
            continue  # blank separators, ": comments", "event:" lines
        payload = raw[5:].strip()
        now = time.perf_counter()
        if payload == b"[DONE]":
            done = True
            break
        obj = json.loads(payload)
        if "error" in obj:
            raise RequestFailed(f"error in stream: {_error_text(obj)}"[:400])
        usage = obj.get("usage")
        if usage:
            req.usage_out = usage.get("completion_tokens", req.usage_out)
            req.usage_in = usage.get("prompt_tokens", req.usage_in)
        for choice in obj.get("choices") or []:
            if checked:
                text.append(_content(choice, chat, True))
                positions += top_logprobs(choice, chat)
            if _content(choice, chat, True):
                if req.first is None:
                    req.first = now
                req.chunk_times.append(now)
            if choice.get("finish_reason") is not None:
                req.finished = True
    if not (done or req.finished):
        raise RequestFailed("stream ended without [DONE] or a finish_reason")
    why = check_output(req.index, "".join(text), positions) if checked else None
    if why is not None:
        raise RequestFailed(f"chat mix: {why}")
    req.tokens_from = "usage" if req.usage_out is not None else "chunks"


async def _lines(resp) -> AsyncIterator[bytes]:
    """The body's lines (LF or CRLF endings) as they arrive, of any length: aiohttp's own
    line reader stops at 128 KiB, and a server that merges many steps into one event may
    send longer. Each chunk is scanned once."""
    parts: list[bytes] = []  # the line so far, from chunks without a newline
    async for chunk in resp.content.iter_any():
        if b"\n" not in chunk:
            parts.append(chunk)
            continue
        first, *lines, rest = chunk.split(b"\n")
        parts.append(first)
        yield b"".join(parts)
        for line in lines:
            yield line
        parts = [rest] if rest else []
    tail = b"".join(parts)
    if tail:  # a last line without its newline
        yield tail


def _read_reply(obj: Any, req: _Request, chat: bool, tokenizer) -> None:
    """A whole (--no-stream) reply into `req`: its usage, else its text's tokens counted."""
    if "error" in obj:
        raise RequestFailed(_error_text(obj)[:400])
    usage = obj.get("usage") or {}
    req.usage_in = usage.get("prompt_tokens")
    req.usage_out = usage.get("completion_tokens")
    if req.usage_out is not None:
        req.tokens_from = "usage"
    else:
        text = "".join(_content(c, chat, False) for c in obj.get("choices") or [])
        req.usage_out = count_tokens(tokenizer, text) if tokenizer else 0
        req.tokens_from = "tokenizer" if tokenizer else "none"
