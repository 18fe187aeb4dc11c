"""OLMo 2 (Olmo2ForCausalLM): the llama layout with post-norm blocks (each attention and
MLP output normed before the residual add, no input norms) and QK-norm over all heads'
q and k at once. The one-call C++ decode step knows neither: its layers run one by one."""

from __future__ import annotations

from common.families.base import Family, LayerRecipe, decoder_args

OLMO2 = Family(
    "olmo2",
    ("Olmo2ForCausalLM",),
    decoder_args,
    recipe=LayerRecipe(pre_norm=False, post_norm=True, qk_norm="full"),
    decode_style=None,
)
