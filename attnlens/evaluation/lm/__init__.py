"""The model's own LM head as a score: negative log-perplexity, higher is better.

:func:`attnlens.evaluation.lm.scorer.score` runs a corpus through the model (with interventions,
e.g. PAPA constants, as ``hooks=``) and reads its LM head:

- ``"causal"`` (decoders): the mean negative log-likelihood of each real token given the tokens
  before it; the first token of a text is not predicted and padding never counts. It equals
  Hugging Face's ``model(input_ids, labels=input_ids).loss`` averaged over the tokens of the
  corpus;
- ``"mlm"`` (encoders): fixed masks (:func:`attnlens.evaluation.lm.masks.mlm_masks`): in each
  text ``mask_rate`` of its real non-special tokens (at least one) are replaced by the
  tokenizer's mask token ([MASK] for all of them: the model's own head was trained to fill
  [MASK]), chosen by a generator seeded from ``seed`` and the text's tokens, so that every
  intervention and every batching sees the same masks. The score is minus the mean
  cross-entropy of the original tokens at the masked positions;
- ``"pll"`` (encoders): the pseudo-log-likelihood of Salazar et al. (2020, "Masked Language Model
  Scoring", ACL): every real non-special token is masked in turn (one copy of the text per token)
  and scored given all the others; the score is the mean ``log p(token | rest)`` over the tokens
  of the corpus, and ``exp(-score)`` the pseudo-perplexity (their PPPL).

Scores are in nats per predicted token. The kind is part of every score
(:class:`attnlens.evaluation.lm.result.LMScore` names it wherever the number is shown): the three
are not comparable with one another.

A head that transformers initialised at load because the checkpoint had none (the default
all-MiniLM-L6-v2 is a bare encoder) is refused with
:class:`attnlens.evaluation.lm.scorer.UntrainedHead`: its scores are noise. Such an encoder is
scored by the MLM probe instead (:mod:`attnlens.evaluation.probing.mlm`: a head trained on the
frozen model), and :func:`attnlens.evaluation.lm.scorer.evaluate` picks the one that applies.

Inputs are tokenized in the ``"padded"`` layout (the tokenizer's own special tokens, right
padding), so masked positions are ordinary positions of ordinary inputs.

One idea per module:

- :mod:`attnlens.evaluation.lm.result`: :class:`~attnlens.evaluation.lm.result.LMScore`, the
  score and the kinds it can be (:data:`~attnlens.evaluation.lm.result.KINDS`);
- :mod:`attnlens.evaluation.lm.masks`: which tokens an MLM score masks
  (:func:`~attnlens.evaluation.lm.masks.mlm_masks`,
  :func:`~attnlens.evaluation.lm.masks.pll_copies`,
  :func:`~attnlens.evaluation.lm.masks.candidates`);
- :mod:`attnlens.evaluation.lm.scorer`: the head's score as an accumulator of the pass
  (:class:`~attnlens.evaluation.lm.scorer.LMScorer`), :func:`~attnlens.evaluation.lm.scorer.score`
  and :func:`~attnlens.evaluation.lm.scorer.evaluate`.
"""
