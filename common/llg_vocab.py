"""llguidance's tokenizer of a model, rebuilt on later starts from a table of its tokens.

    tokenizer.json ──LLTokenizer(json)──▶ tokenizer  (the first time: it parses the json
         │                                   │        and the vocabulary, holding the GIL:
         │                                   │        0.5 s for 49k tokens, 2.3 s for
         │                                   ▼        Gemma 3's 262k)
         │                           TokenTable.of(tokenizer): each id's bytes, the special
         │                                   │          ids, EOS ─▶ cache_dir/llg-vocab/KEY.npz
         └── later starts: KEY.npz ──LLTokenizer(TableTokenizer)──▶ the same tokenizer
                                               (the trie and its slices, 1 s for 262k
                                               tokens, and the HF tokenizer it tokenizes
                                               text with, 1 s: against 2.3-2.6 s from
                                               the json)

The table holds what llguidance itself made of tokenizer.json, read back through its own
API (decode_bytes, is_special_token), so the tokenizer built from it has the same token
trie, hence the same masks (tests/common/test_llg_vocab.py compares them). KEY hashes
tokenizer.json, the logits' width, the EOS id asked for and llguidance's version: a changed
file or library builds from the json again. Text tokenization (llguidance tokenizes the
bytes a grammar forces, during mask computations) goes to the HF `tokenizers` model of the
same file, loaded with the table, as llguidance's json build does (hf_tokenizer).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import llguidance
import numpy as np
import tokenizers
from llguidance._tokenizer import TokenizerWrapper

from common.log import get_logger

log = get_logger("llg_vocab")

TABLE_FORMAT = 1
SPECIAL_MARKER = 0xFF  # llguidance's first byte of a special token in its trie


def from_json(tokenizer_json: Path, n_vocab: int, eos: int | None) -> llguidance.LLTokenizer:
    """llguidance's own build from tokenizer.json (ValueError when it cannot read it)."""
    return llguidance.LLTokenizer(tokenizer_json.read_text(), n_vocab=n_vocab, eos_token=eos)


@dataclass(frozen=True)
class TokenTable:
    """A built tokenizer's vocabulary: `blob[offsets[i]:offsets[i + 1]]` is token i's bytes
    as its trie holds them (the special marker left off), `special` the ids marked special."""

    blob: bytes
    offsets: np.ndarray  # int64 [vocab + 1]
    special: np.ndarray  # int64 ids
    eos: int

    @classmethod
    def of(cls, tok: llguidance.LLTokenizer) -> TokenTable:
        n = tok.vocab_size
        special = [i for i in range(n) if tok.is_special_token(i)]
        is_special = set(special)
        tokens = []
        for i in range(n):
            b = tok.decode_bytes([i])
            # an id with no bytes (past the tokenizer's own vocabulary) decodes as "<[i]>"
            if i not in is_special and b == f"<[{i}]>".encode():
                b = b""
            tokens.append(b)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum([len(b) for b in tokens], out=offsets[1:])
        return cls(b"".join(tokens), offsets, np.array(special, dtype=np.int64), tok.eos_token)

    def tokens(self) -> list[bytes]:
        o, blob = self.offsets.tolist(), self.blob
        return [blob[o[i] : o[i + 1]] for i in range(len(o) - 1)]

    def save(self, path: Path) -> None:
        """Written whole or not at all (a temporary file renamed), so two processes that
        build it at once leave one good copy."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(
                    f,
                    format=np.array([TABLE_FORMAT]),
                    blob=np.frombuffer(self.blob, dtype=np.uint8),
                    offsets=self.offsets,
                    special=self.special,
                    eos=np.array([self.eos]),
                )
            os.chmod(tmp, 0o644)  # as the cache's other files (mkstemp makes it 0600)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> TokenTable:
        """ValueError (or OSError) for a file that is not a whole table of this format."""
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["format"][0]) != TABLE_FORMAT:
                    raise ValueError(f"{path}: table format {int(z['format'][0])}")
                blob, offsets = z["blob"].tobytes(), z["offsets"]
                special, eos = z["special"], int(z["eos"][0])
        except (EOFError, KeyError, IndexError, zipfile.BadZipFile) as e:
            raise ValueError(f"{path}: not a token table ({type(e).__name__}: {e})") from None
        n = len(offsets) - 1
        if n < 1 or offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) < 0):
            raise ValueError(f"{path}: offsets do not cut the token bytes")
        if not 0 <= eos < n or np.any((special < 0) | (special >= n)):
            raise ValueError(f"{path}: token ids out of range")
        return cls(blob, offsets, special, eos)


def hf_tokenizer(raw_json: bytes) -> tokenizers.Tokenizer:
    """The HF tokenizer llguidance tokenizes text with when it builds from the json: the
    same file, minus any Prepend inside a Sequence normalizer (llguidance drops those)."""
    if b'"Prepend"' not in raw_json:
        return tokenizers.Tokenizer.from_str(raw_json.decode())
    data = json.loads(raw_json)
    norm = data.get("normalizer")
    if isinstance(norm, dict) and norm.get("type") == "Sequence":
        norm["normalizers"] = [n for n in norm["normalizers"] if n.get("type") != "Prepend"]
    return tokenizers.Tokenizer.from_str(json.dumps(data))


class TableTokenizer(TokenizerWrapper):
    """What LLTokenizer takes in place of a tokenizer.json (a TokenizerWrapper): the token
    bytes, the special ids (their marker added by llguidance), EOS, and a call that
    tokenizes text. TokenizerWrapper's own __init__ is not run (it probes the call).

    The call is made during mask computations (llguidance tokenizes the bytes a grammar
    forces, e.g. a JSON key, to force their canonical tokens), so its HF tokenizer is
    loaded here, before anything is served: loaded at the first constrained request, it
    would hold the GIL for a second (Gemma 3) and silence the heartbeat thread."""

    def __init__(self, table: TokenTable, raw_json: bytes):
        self.is_tokenizer_wrapper = True  # what llguidance checks
        self.tokens = table.tokens()
        self.special_token_ids = table.special.tolist()
        self.eos_token_id = table.eos
        self.bos_token_id = None  # llguidance keeps it but does not use it
        self._hf = hf_tokenizer(raw_json)

    def __call__(self, text: str | bytes) -> list[int]:
        """Token ids of valid UTF-8 text (llguidance hands over only the valid part), as
        its json build's tokenizer gives them: encode(text, add_special_tokens=False)."""
        s = text.decode() if isinstance(text, bytes) else text
        return self._hf.encode(s, add_special_tokens=False).ids


def table_path(cache_dir: Path, tokenizer_json: Path, n_vocab: int, eos: int | None) -> Path:
    return _table_path(cache_dir, tokenizer_json.read_bytes(), n_vocab, eos)


def _table_path(cache_dir: Path, raw_json: bytes, n_vocab: int, eos: int | None) -> Path:
    h = hashlib.sha256(raw_json)
    h.update(f"|{n_vocab}|{eos}|{llguidance.__version__}|{TABLE_FORMAT}".encode())
    return cache_dir / "llg-vocab" / f"{h.hexdigest()[:32]}.npz"


def build(
    tokenizer_json: Path, n_vocab: int, eos: int | None, cache_dir: Path | None
) -> llguidance.LLTokenizer:
    """The llguidance tokenizer: from the cached table when there is one, else from the
    json (the table then saved for the next start; a cache that cannot be written is
    skipped). cache_dir None: always from the json."""
    if cache_dir is None:
        return from_json(tokenizer_json, n_vocab, eos)
    raw_json = tokenizer_json.read_bytes()
    path = _table_path(cache_dir, raw_json, n_vocab, eos)
    try:
        table = TokenTable.load(path)
    except FileNotFoundError:
        table = None
    except (OSError, ValueError) as e:
        log.warning("llguidance token table %s unreadable (%s): built from the json", path, e)
        table = None
    if table is not None:
        return llguidance.LLTokenizer(TableTokenizer(table, raw_json))
    tok = from_json(tokenizer_json, n_vocab, eos)
    try:
        TokenTable.of(tok).save(path)
    except OSError as e:
        log.warning("llguidance token table not cached at %s: %s", path, e)
    return tok
