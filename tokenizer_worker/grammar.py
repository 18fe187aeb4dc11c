"""Structured outputs at intake: each request's grammar compiled once, before any engine.

    SamplingParams.structured ─▶ cache (by spec text) ─hit─▶ ok / the same 400 again
                                       │ miss
                                       └─▶ common.grammar.grammar_text ─▶ llguidance
                                           validate against the model's tokenizer

A schema, regex or grammar that does not compile is a 400 here, naming `structured`
(the frontend renames it to the field the client sent: response_format,
structured_outputs.json, ...). The schedulers build their matchers from the same spec
(scheduler_worker.structured); what passed here compiles there.

The llguidance tokenizer takes about 0.5 s to build: a thread starts it with the worker,
so the first constrained request rarely waits for it.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import llguidance

from common.grammar import GrammarError, check, grammar_text, llg_tokenizer

MAX_CACHED = 1024


class GrammarCheck:
    def __init__(self, model_dir: Path, vocab_size: int) -> None:
        pool = ThreadPoolExecutor(1, thread_name_prefix="llg-tokenizer")
        self._tokenizer: Future[llguidance.LLTokenizer] = pool.submit(
            llg_tokenizer, str(model_dir), vocab_size
        )
        pool.shutdown(wait=False)
        self._seen: OrderedDict[str, str | None] = OrderedDict()  # spec -> error or None

    def __call__(self, structured: dict[str, str]) -> None:
        """GrammarError if the (shape-checked) spec does not compile."""
        key = json.dumps(structured, sort_keys=True)
        if key in self._seen:
            self._seen.move_to_end(key)
            error = self._seen[key]
        else:
            try:
                tokenizer = self._tokenizer.result()
            except Exception as e:  # a tokenizer llguidance cannot read: no grammar at all
                raise GrammarError(
                    f"structured outputs are not available for this model: {e}"
                ) from None
            try:
                check(grammar_text(structured), tokenizer)
                error = None
            except GrammarError as e:
                error = str(e)
            self._seen[key] = error
            if len(self._seen) > MAX_CACHED:
                self._seen.popitem(last=False)
        if error is not None:
            raise GrammarError(error)
