"""frontend → tokenizer_worker pool (PUSH/PULL fan-out): one raw request to tokenize, or
one call of the tokenizer endpoints (/tokenize, /detokenize, /tokenizer_info), which a
worker answers itself (TokenizerReply) without involving the scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from common.messages.base import Message
from common.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class TokenizeRequest(Message):
    TAG: ClassVar[int] = 1
    rid: str
    kind: str  # "completion" | "chat"
    prompt: str | None  # completion with a text prompt
    prompt_token_ids: bytes | None  # completion with token ids (pack_ids)
    messages: list | None  # chat: list of {"role", "content"} dicts
    # validated at intake; an unset max_tokens (None) is settled by the tokenizer worker
    params: SamplingParams
    origin: int = 0  # pid of the frontend that accepted it (restarts abort only its own)
    frontend: int = 0  # that frontend's id (--frontend-id): errors and outputs go back there
    # the scheduler replica the frontend chose (frontend.cluster.routing) and its inbox (None:
    # the config's address for that replica, IPCConfig.replica_endpoint)
    replica: int = 0
    inbox: str | None = None
    # chat with tools (frontend.tools.request): the checked tool list the prompt shows, or None
    tools: list | None = None
    # chat: more chat template variables (chat_template_kwargs, enable_thinking), or None
    chat_template_kwargs: dict | None = None
    # OpenAI's `prediction` (its text; frontend.prediction), or None
    prediction: str | None = None
    # chat: the prompt ends inside the final (assistant) message, which the model continues
    continue_final: bool = False


@dataclass(frozen=True, slots=True)
class TokenizerCall(Message):
    TAG: ClassVar[int] = 20
    call_id: str  # the frontend's, echoed in the TokenizerReply
    op: str  # "tokenize" | "detokenize" | "tokenizer_info"
    args: dict[str, Any]  # the op's arguments (tokenizer_worker.endpoints)
    frontend: int = 0  # the calling frontend's id: the reply goes to its inbox
