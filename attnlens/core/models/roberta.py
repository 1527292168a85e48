"""RoBERTa (Liu et al. 2019): BERT's encoder with byte-level BPE, ``<s> … </s>``, and position
ids that start after ``padding_idx`` (so ``padding_idx + 1`` position embeddings are unused)."""

from typing import Any

from attnlens.core.models.base import ENCODER_AS_DECODER, Architecture


def reserved_positions(config: Any) -> int:
    """RoBERTa counts positions from ``padding_idx + 1``."""
    return int(getattr(config, "pad_token_id", None) or 0) + 1


ARCHITECTURE = Architecture(
    name="roberta",
    model_types=("roberta",),
    hf_classes=("RobertaForMaskedLM",),
    causal=False,
    refused_settings=(ENCODER_AS_DECODER,),
    seam="attnlens",
    layout="papa",
    post_norm=True,
    counts_positions=True,
    reserved_positions=reserved_positions,
    lm_head_keys=("lm_head.dense.", "lm_head.layer_norm."),
    output_embedding_keys=("lm_head.decoder.weight",),
)
