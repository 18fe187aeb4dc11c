"""Per-request incremental detokenizer: token ids in, text deltas out, stop strings cut.

Two stages, each O(new tokens) per call (never a re-decode of the whole output):

1. Tokens → complete text (vLLM's prefix/read-offset algorithm). Only a short window of
   ids is kept; the text of `window[:read]` (the prefix) has already been emitted, and
   the text of `window[read:]` is pending:

       output ids:  ... emitted earlier ... | prefix (context) | pending |
                                            ^ window[0]        ^ read

   delta = decode(window) minus decode(prefix) minus what was already sent. The prefix
   gives the decoder context (SentencePiece drops a leading space at the start of a
   decode; byte-level tokens need their neighbours). A decode ending in U+FFFD has an
   incomplete UTF-8 character split across tokens: the text before it goes out now, the
   character once it completes, and `read` moves only at a clean tail.

2. Text → stream-safe text. Any suffix of the text that is a proper prefix of a stop
   string is held back (at most max_stop_len - 1 characters), so a stop string never
   leaks; a stop string hit ends the delta right before it (or after it with
   include_stop_str_in_output). The stop string that *completes* first wins (ties: the
   longer one); this is independent of how tokens are chunked. Before `min_tokens`
   tokens, no stop string counts (vLLM's min_tokens: the text goes out as it is); from
   the call that reaches it on, the text it brings is searched.

Invariant (tested): without a stop hit, "".join(deltas) + finish() equals
tokenizer.decode(all_ids, skip_special_tokens=...).
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"
MAX_PARTIAL_TOKENS = 3  # a UTF-8 char has at most 3 bytes after its first, 1+ byte per token
MAX_PENDING_TOKENS = 8  # tokens behind an unclean tail before `read` is forced on


class RequestDetokenizer:
    """Stateful per request. `tokenizer` needs `decode(ids, skip_special_tokens=...) -> str`
    (a `tokenizers.Tokenizer`)."""

    def __init__(
        self,
        tokenizer: Any,
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.include_stop_str_in_output = include_stop_str_in_output
        self.stop = [s for s in (stop or []) if s]
        self.min_tokens = min_tokens
        self.num_tokens = 0
        self.stopped = False  # a stop string was hit; every later call returns ""
        self.stop_str: str | None = None  # the stop string that was hit
        self._window: list[int] = []
        self._read = 0  # window[:read] is the emitted prefix
        self._prefix_text = ""  # decode(window[:read])
        self._sent = 0  # characters of decode(window) past the prefix already emitted
        self._held = ""  # decoded text held back because it may start a stop string

    def add_tokens(self, token_ids: list[int]) -> tuple[str, bool]:
        """Feed new ids; return (text safe to emit now, stop string hit)."""
        if self.stopped:
            return "", True
        self.num_tokens += len(token_ids)
        self._window.extend(token_ids)
        return self._apply_stop(self._decode_new(flush=False), final=False)

    def finish(self) -> str:
        """The request ended normally: flush everything held back (partial characters are
        decoded as U+FFFD, as a full decode would). A stop string completed by the flushed
        text is still honoured (check `stopped`)."""
        if self.stopped:
            return ""
        text, _ = self._apply_stop(self._decode_new(flush=True), final=True)
        return text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _decode_new(self, flush: bool) -> str:
        window, read = self._window, self._read
        if len(window) == read:
            return ""
        text = self._decode(window)
        emitted_end = len(self._prefix_text) + self._sent  # decode(window)[:emitted_end] is out
        if flush or not text.endswith(REPLACEMENT):
            self._advance(len(window), sent=0)
            return text[emitted_end:]
        # Incomplete character at the tail: emit the complete text before it now, but keep
        # the token boundary where it is until the character completes.
        stable_end = max(emitted_end, len(text.rstrip(REPLACEMENT)))
        if len(window) - read <= MAX_PENDING_TOKENS:
            self._sent = stable_end - len(self._prefix_text)
            return text[emitted_end:stable_end]
        # Many tokens behind an unclean tail: a big chunk ending mid-character, or a model
        # emitting runs of invalid bytes so the tail never comes clean. Move the boundary to one whose text the following tokens (3+ bytes) can no
        # longer change (its decode is a prefix of the whole), keeping the window bounded.
        last = len(window) - MAX_PARTIAL_TOKENS
        for cut in range(last, max(read, last - MAX_PENDING_TOKENS), -1):
            t = self._decode(window[:cut])
            if text.startswith(t):
                self._advance(cut, sent=max(0, stable_end - len(t)))
                return text[emitted_end : max(stable_end, len(t))]
        self._advance(len(window), sent=0)  # give up exactness, stay bounded
        return text[emitted_end:]

    def _advance(self, cut: int, sent: int) -> None:
        """Move the token boundary to `cut`: window[read:cut] becomes the next prefix, and
        `sent` characters of text past the boundary have already been emitted."""
        old_read = self._read
        self._window = self._window[old_read:]
        self._read = cut - old_read
        self._prefix_text = self._decode(self._window[: self._read])
        self._sent = sent

    def _apply_stop(self, new_text: str, final: bool) -> tuple[str, bool]:
        if not self.stop or self.num_tokens < self.min_tokens:
            return new_text, False  # (nothing is held while stops do not count)
        buf = self._held + new_text
        if not buf:
            return "", False
        # A match lying entirely in _held would have been found by an earlier call.
        best: tuple[int, int, str] | None = None  # (end, -len, stop)
        for s in self.stop:
            i = buf.find(s, max(0, len(self._held) - len(s) + 1))
            if i >= 0 and (best is None or (i + len(s), -len(s)) < best[:2]):
                best = (i + len(s), -len(s), s)
        if best is not None:
            end, _, s = best
            self.stopped, self.stop_str, self._held = True, s, ""
            return buf[: end if self.include_stop_str_in_output else end - len(s)], True
        keep = 0 if final else self._stop_prefix_len(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], False

    def _stop_prefix_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        for k in range(min(len(buf), max(map(len, self.stop)) - 1), 0, -1):
            tail = buf[-k:]
            if any(len(s) > k and s.startswith(tail) for s in self.stop):
                return k
        return 0
