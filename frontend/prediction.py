"""OpenAI's Predicted Outputs at intake: `prediction` on chat completions (and, in the same
shape, on completions), `{"type": "content", "content": str | [{"type": "text", "text":
str}, ...]}`. Its text travels to the tokenizer pool (TokenizeRequest.prediction), which
tokenizes it and refuses one longer than the context; the scheduler drafts from it
(scheduler_worker/spec/prediction.py) and reports accepted_prediction_tokens /
rejected_prediction_tokens (frontend.api.openai_usage). As OpenAI, a prediction with more
than one choice is refused (docs/predicted_outputs.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from frontend.errors import invalid


class PredictionPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class PredictionContent(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["content"]
    content: str | list[PredictionPart]


def prediction_text(prediction: PredictionContent | None, num_choices: int) -> str | None:
    """The prediction's text (its parts joined), or None; a 400 with several choices."""
    if prediction is None:
        return None
    if num_choices > 1:
        raise invalid("prediction: not supported with more than one choice (n > 1)", "n")
    content = prediction.content
    return content if isinstance(content, str) else "".join(p.text for p in content)


def prediction_counts(timings: dict[str, Any] | None) -> tuple[int, int] | None:
    """(accepted, rejected) prediction tokens from a finishing output's scheduler counts
    (scheduler_worker/step_output.py), or None: no prediction, or not reported."""
    if timings is None:
        return None
    accepted, rejected = (
        timings.get("accepted_prediction_tokens"),
        timings.get("rejected_prediction_tokens"),
    )
    if type(accepted) is not int or type(rejected) is not int:
        return None
    return accepted, rejected
