"""Structured outputs at intake: each request's grammar compiled once, before any engine.

    SamplingParams.structured ─▶ cache (by spec text) ─hit─▶ ok / the same 400 again
                                       │ miss
                                       └─▶ common.grammar.grammar_text ─▶ llguidance
                                           validate (the model's tokenizer: only if it names tokens)

A schema, regex or grammar that does not compile is a 400 here, naming `structured`
(the frontend renames it to the field the client sent: response_format,
structured_outputs.json, ...). The schedulers build their matchers from the same spec
(scheduler_worker.structured); what passed here compiles there.

Grammars are validated without a tokenizer: only one that names tokens (<|special|>,
<[id]>) needs the model's, built the first time one comes (0.5 s for 49k tokens, 2.6 s
and ~100 MB for Gemma 3's 262k). Built at start, it held the GIL through the first
seconds of every worker and took a core from the scheduler's start on a small machine,
for grammars that almost never name tokens (none of the JSON schema, regex, choice or
tool-call grammars this server makes do).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import llguidance

from common.grammar import GrammarError, check, grammar_text, llg_tokenizer

MAX_CACHED = 1024


class GrammarCheck:
    def __init__(self, model_dir: Path, vocab_size: int) -> None:
        self._model_dir, self._vocab_size = str(model_dir), vocab_size
        self._seen: OrderedDict[str, str | None] = OrderedDict()  # spec -> error or None

    def _tokenizer(self) -> llguidance.LLTokenizer:
        try:
            return llg_tokenizer(self._model_dir, self._vocab_size)  # cached
        except Exception as e:  # a tokenizer llguidance cannot read
            raise GrammarError(
                f"structured outputs are not available for this model: {e}"
            ) from None

    def __call__(self, structured: dict[str, str]) -> None:
        """GrammarError if the (shape-checked) spec does not compile."""
        key = json.dumps(structured, sort_keys=True)
        if key in self._seen:
            self._seen.move_to_end(key)
            error = self._seen[key]
        else:
            try:
                check(grammar_text(structured), self._tokenizer)
                error = None
            except GrammarError as e:
                error = str(e)
            self._seen[key] = error
            if len(self._seen) > MAX_CACHED:
                self._seen.popitem(last=False)
        if error is not None:
            raise GrammarError(error)
