"""Whether schema-constrained output ends on its own, in every API dialect (issue 55).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/check_structured_ends.py [--url URL]
        [--prompts 5] [--max-tokens 200] [--seed N]

The schema people write (no additionalProperties, a `number` field: CITY) through each
dialect with its official client: chat completions (plain, streamed, the openai client's
`parse()` with a pydantic model), the Responses API's `text.format`, a forced tool call
(OpenAI chat, and Anthropic's tool_use), Anthropic's `output_config.format`, and
LangChain's `with_structured_output`. Greedy (or sampled at 0.7 with --seed where the
dialect takes one), each prompt once per dialect; a line per dialect says how many outputs ended
on their own (not at --max-tokens) and how many validate against CITY, with their token
counts. Without --url it starts launch.py with the default model. tests/e2e/
test_structured_ends.py runs `ask` on the test server.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import jsonschema
import openai
from pydantic import BaseModel

MODEL = "smollm2"
CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "country": {"type": "string"},
        "population_millions": {"type": "number"},
    },
    "required": ["name", "country", "population_millions"],
}
PROMPTS = [
    "Describe Oslo as JSON.",
    "Give me a city as JSON.",
    "Tell me about Tokyo in JSON.",
    "A city and its population, as JSON.",
    "Describe Paris as JSON.",
]


class City(BaseModel):
    name: str
    country: str
    population_millions: float


@dataclass
class Outcome:
    ended: bool  # on its own: the dialect's own end, not its max-tokens reason
    reason: str  # as the dialect says it (finish_reason, status, stop_reason)
    text: str  # the JSON the dialect returned (content, arguments, tool input)
    tokens: int

    def valid(self) -> bool:
        """The text parses and validates against CITY, with no property beyond it."""
        try:
            obj = json.loads(self.text)
            jsonschema.validate(obj, {**CITY, "additionalProperties": False})
        except (ValueError, jsonschema.ValidationError):
            return False
        return True


@dataclass
class Clients:
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    url: str

    @classmethod
    def at(cls, url: str) -> Clients:
        o = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        a = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
        return cls(o, a, url)


# sampled at a usual setting: at 1.0 a string (unbounded by design:
# docs/structured-outputs.md) can ramble on
SAMPLED_TEMPERATURE = 0.7


def _sampling(seed: int | None) -> dict[str, Any]:
    return (
        {"temperature": 0} if seed is None else {"temperature": SAMPLED_TEMPERATURE, "seed": seed}
    )


def _messages(prompt: str) -> list[Any]:
    return [{"role": "user", "content": prompt}]


RF = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
TOOL = {"type": "function", "function": {"name": "city", "parameters": CITY}}


def chat(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    r = c.openai.chat.completions.create(
        model=MODEL,
        messages=_messages(prompt),
        response_format=RF,
        max_tokens=max_tokens,
        **_sampling(seed),
    )
    ch = r.choices[0]
    tokens = r.usage.completion_tokens if r.usage else 0
    return Outcome(ch.finish_reason == "stop", ch.finish_reason, ch.message.content or "", tokens)


def chat_stream(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    stream = c.openai.chat.completions.create(
        model=MODEL,
        messages=_messages(prompt),
        response_format=RF,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        **_sampling(seed),
    )
    parts, reason, tokens = [], "", 0
    for chunk in stream:
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            reason = ch.finish_reason or reason
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return Outcome(reason == "stop", reason, "".join(parts), tokens)


def chat_parse(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    try:
        r = c.openai.chat.completions.parse(
            model=MODEL,
            messages=_messages(prompt),
            response_format=City,
            max_tokens=max_tokens,
            **_sampling(seed),
        )
    except openai.LengthFinishReasonError as e:  # what parse() raises at max_tokens
        return Outcome(
            False, "length", "", e.completion.usage.completion_tokens if e.completion.usage else 0
        )
    ch = r.choices[0]
    ok = isinstance(ch.message.parsed, City)
    tokens = r.usage.completion_tokens if r.usage else 0
    return Outcome(
        ok and ch.finish_reason == "stop", ch.finish_reason, ch.message.content or "", tokens
    )


def responses(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    assert seed is None, "the Responses API takes no seed"
    fmt = {"type": "json_schema", "name": "city", "schema": CITY}
    r = c.openai.responses.create(
        model=MODEL,
        input=prompt,
        text={"format": fmt},
        max_output_tokens=max_tokens,
        temperature=0,
    )
    tokens = r.usage.output_tokens if r.usage else 0
    return Outcome(r.status == "completed", str(r.status), r.output_text, tokens)


def tool_call(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    r = c.openai.chat.completions.create(
        model=MODEL,
        messages=_messages(prompt),
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "city"}},
        max_tokens=max_tokens,
        **_sampling(seed),
    )
    ch = r.choices[0]
    calls = ch.message.tool_calls or []
    args = calls[0].function.arguments if len(calls) == 1 else ""
    tokens = r.usage.completion_tokens if r.usage else 0
    return Outcome(ch.finish_reason == "tool_calls", ch.finish_reason, args, tokens)


def anthropic_tool(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    assert seed is None, "the Messages API takes no seed"
    m = c.anthropic.messages.create(
        model=MODEL,
        max_tokens=max_tokens,
        messages=_messages(prompt),
        tools=[{"name": "city", "input_schema": CITY}],
        tool_choice={"type": "tool", "name": "city"},
        extra_body={"temperature": 0},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    text = json.dumps(uses[0].input) if len(uses) == 1 else ""
    return Outcome(m.stop_reason == "tool_use", str(m.stop_reason), text, m.usage.output_tokens)


FORMAT = {"type": "json_schema", "schema": CITY}


def anthropic_format(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    assert seed is None, "the Messages API takes no seed"
    m = c.anthropic.messages.create(
        model=MODEL,
        max_tokens=max_tokens,
        messages=_messages(prompt),
        extra_body={"temperature": 0, "output_config": {"format": FORMAT}},
    )
    text = "".join(b.text for b in m.content if b.type == "text")
    return Outcome(m.stop_reason == "end_turn", str(m.stop_reason), text, m.usage.output_tokens)


def langchain(c: Clients, prompt: str, seed: int | None, max_tokens: int) -> Outcome:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=c.url + "/v1",
        api_key="unused",
        model=MODEL,
        max_tokens=max_tokens,
        max_retries=0,
        **_sampling(seed),
    )
    try:
        out = llm.with_structured_output(City, method="json_schema", include_raw=True).invoke(
            prompt
        )
    except openai.LengthFinishReasonError as e:  # parse() under LangChain, as above
        usage = e.completion.usage
        return Outcome(False, "length", "", usage.completion_tokens if usage else 0)
    raw = out["raw"]
    reason = raw.response_metadata.get("finish_reason", "")
    tokens = (raw.usage_metadata or {}).get("output_tokens", 0)
    ok = isinstance(out["parsed"], City) and reason == "stop"
    return Outcome(ok, reason, raw.content if isinstance(raw.content, str) else "", tokens)


DIALECTS: dict[str, Callable[[Clients, str, int | None, int], Outcome]] = {
    "chat": chat,
    "chat stream": chat_stream,
    "chat parse()": chat_parse,
    "responses text.format": responses,
    "chat forced tool call": tool_call,
    "anthropic forced tool_use": anthropic_tool,
    "anthropic output_config": anthropic_format,
    "langchain structured": langchain,
}
SEEDLESS = ("responses text.format", "anthropic forced tool_use", "anthropic output_config")


def run(c: Clients, prompts: list[str], seed: int | None, max_tokens: int) -> bool:
    """A line per dialect; whether every output ended and validated."""
    all_ok = True
    print(f"{'dialect':28s} {'ended':>6s} {'valid':>6s}  tokens (mean, max)  reasons")
    for name, ask in DIALECTS.items():
        if seed is not None and name in SEEDLESS:
            print(f"{name:28s}  (takes no seed: greedy only)")
            continue
        outs = [ask(c, p, seed, max_tokens) for p in prompts]
        ended = sum(o.ended for o in outs)
        valid = sum(o.valid() for o in outs)
        toks = [o.tokens for o in outs]
        reasons = sorted({o.reason for o in outs})
        print(
            f"{name:28s} {ended:>3d}/{len(outs)} {valid:>3d}/{len(outs)}  "
            f"{statistics.fmean(toks):6.1f} {max(toks):5d}        {', '.join(reasons)}"
        )
        for o in outs:
            if not (o.ended and o.valid()):
                print(f"    {o.reason}: {o.text[:120]!r}")
        all_ok &= ended == valid == len(outs)
    return all_ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running server (default: start launch.py)")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--seed", type=int, help="sample at temperature 0.7 with this seed")
    args = ap.parse_args()
    server = None
    if args.url is None:
        from benchmarks.comparison.zeroserve_proc import Zeroserve

        log = Path(tempfile.mkdtemp(prefix="zs-ends-")) / "server.log"
        server = Zeroserve(MODEL, [], log)
        server.start(timeout_s=300)
        assert server.proc is not None
        args.url = server.proc.base_url
    try:
        t0 = time.perf_counter()
        ok = run(Clients.at(args.url), PROMPTS[: args.prompts], args.seed, args.max_tokens)
        verdict = "all ended and valid" if ok else "NOT all ended and valid"
        print(f"{verdict} ({time.perf_counter() - t0:.0f} s)")
    finally:
        if server is not None:
            server.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
