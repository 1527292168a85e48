"""GPT-2 (Radford et al. 2019): a decoder; TransformerLens's bridge runs attention itself, so
``hook_pattern`` edits are honoured natively; bos and eos are often one token."""

from attnlens.core.models.base import Architecture

ARCHITECTURE = Architecture(
    name="gpt2",
    model_types=("gpt2",),
    hf_classes=("GPT2LMHeadModel",),
    causal=True,
    seam="native",
    layout="padded",
    positions_from_mask=True,
    counts_positions=True,
    output_embedding_keys=("lm_head.weight",),
    refused_settings=(
        ("scale_attn_weights", False, "TransformerLens's bridge divides the attention scores by "
         "sqrt(d_head) whatever the config says, so its outputs would not be the model's"),
    ),
)
