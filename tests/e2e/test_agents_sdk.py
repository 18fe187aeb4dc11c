"""The OpenAI Agents SDK (openai-agents) running one agent with one function tool against
the real server (launch.py, the default model) over /v1/responses: the SDK's own request
shapes, the forced call it asks for, the tool's output sent back as a
function_call_output item, and a final answer."""

from __future__ import annotations

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

pytestmark = pytest.mark.timeout(180)

set_tracing_disabled(True)  # the SDK would send its traces to OpenAI


def _agent(server, tool, **settings) -> Agent:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    return Agent(
        name="calculator",
        instructions="You add numbers with the add tool, then say the sum.",
        tools=[tool],
        model=OpenAIResponsesModel(model="smollm2", openai_client=client),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64
        ),
        **settings,
    )


def _add_tool(calls: list):
    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    return add


def test_agent_calls_its_tool_and_stops_on_its_output(server):
    calls: list = []
    agent = _agent(server, _add_tool(calls), tool_use_behavior="stop_on_first_tool")
    result = Runner.run_sync(agent, "What is 2 plus 3?", max_turns=2)
    assert len(calls) == 1 and all(isinstance(x, int) for x in calls[0])
    assert result.final_output == str(sum(calls[0]))


def test_agent_loop_sends_the_tool_output_back_and_answers(server):
    """The SDK's loop: a forced call, the tool runs, its output goes back (the SDK resets
    tool_choice to auto), and the model answers in text."""
    calls: list = []
    result = Runner.run_sync(_agent(server, _add_tool(calls)), "What is 2 plus 3?", max_turns=4)
    assert calls, "the tool never ran"
    assert isinstance(result.final_output, str) and result.final_output.strip()
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert kinds[-1] == "message_output_item", kinds
