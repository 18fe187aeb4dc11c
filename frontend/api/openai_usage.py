"""OpenAI's usage object of a chat or completion response, from its choices
(openai_format.Choice): tokens in and out, the prompt tokens the prefix cache served,
reasoning tokens, and Predicted Outputs' accepted / rejected prediction tokens."""

from __future__ import annotations

from typing import Any


def usage_of(num_prompt_tokens: int, num_output_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
    }


def usage(choices: list[Any], details: bool = True, reasoning: bool = False) -> dict[str, Any]:
    """OpenAI's usage; `details`: with prompt_tokens_details.cached_tokens, the prompt
    tokens served from the prefix cache (a prompt with n choices: the fewest any found);
    `reasoning`: with completion_tokens_details.reasoning_tokens. A request with a
    prediction has OpenAI's accepted_prediction_tokens and rejected_prediction_tokens
    there, the rejected ones counted in completion_tokens as OpenAI bills them."""
    prompts: dict[int, int] = {}  # each prompt counts once, however many choices it has
    cached: dict[int, int] = {}
    for c in choices:
        i = c.prompt_index
        prompts[i] = max(prompts.get(i, 0), c.num_prompt_tokens)
        cached[i] = min(cached.get(i, c.num_cached_tokens), c.num_cached_tokens)
    predicted = [c.prediction for c in choices if c.prediction is not None]
    rejected = sum(r for _, r in predicted)
    out = usage_of(sum(prompts.values()), sum(c.num_output_tokens for c in choices) + rejected)
    if details:
        out["prompt_tokens_details"] = {"cached_tokens": sum(cached.values())}
    completion: dict[str, int] = {}
    if reasoning:
        completion["reasoning_tokens"] = sum(c.num_reasoning_tokens for c in choices)
    if predicted:
        completion["accepted_prediction_tokens"] = sum(a for a, _ in predicted)
        completion["rejected_prediction_tokens"] = rejected
    if completion:
        out["completion_tokens_details"] = completion
    timings = [c.timings for c in choices]
    if any(t is not None for t in timings):  # extension, only with return_timings
        out["timings"] = timings[0] if len(timings) == 1 else timings
    return out
