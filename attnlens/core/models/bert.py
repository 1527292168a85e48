"""BERT (Devlin et al. 2019): an encoder; [CLS] … [SEP]; pattern edits through the attnlens seam."""

from attnlens.core.models.base import ENCODER_AS_DECODER, Architecture

ARCHITECTURE = Architecture(
    name="bert",
    model_types=("bert",),
    hf_classes=("BertForMaskedLM",),
    causal=False,
    refused_settings=(ENCODER_AS_DECODER,),
    seam="attnlens",
    layout="papa",
    post_norm=True,
    lm_head_keys=("cls.predictions.transform.",),
    output_embedding_keys=("cls.predictions.decoder.weight",),
)
