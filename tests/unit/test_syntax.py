"""attnlens.methods.syntax: attention heads as dependency parsers (Clark et al. 2019, §4)."""

from __future__ import annotations

import warnings

import pytest
import torch

import attnlens
from attnlens import Words
from attnlens.engine import passes
from attnlens.methods import conllu, syntax
from tests import tiny
from tests.conftest import data_file

#: two hand-made trees; the second has a multiword token (1-2) and an empty node (3.1), both
#: skipped, words that split into several sub-tokens, and a relation subtype (obl:over)
CONLLU = """\
# sent_id = 1
# text = The quick brown fox jumps over the lazy dog.
1\tThe\tthe\tDET\tDT\t_\t4\tdet\t_\t_
2\tquick\tquick\tADJ\tJJ\t_\t4\tamod\t_\t_
3\tbrown\tbrown\tADJ\tJJ\t_\t4\tamod\t_\t_
4\tfox\tfox\tNOUN\tNN\t_\t5\tnsubj\t_\t_
5\tjumps\tjump\tVERB\tVBZ\t_\t0\troot\t_\t_
6\tover\tover\tADP\tIN\t_\t9\tcase\t_\t_
7\tthe\tthe\tDET\tDT\t_\t9\tdet\t_\t_
8\tlazy\tlazy\tADJ\tJJ\t_\t9\tamod\t_\t_
9\tdog\tdog\tNOUN\tNN\t_\t5\tobl:over\t_\t_
10\t.\t.\tPUNCT\t.\t_\t5\tpunct\t_\t_

# sent_id = 2
1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tdo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\ttokenize\ttokenize\tVERB\tVB\t_\t0\troot\t_\t_
3.1\tx\tx\tVERB\tVB\t_\t_\t_\t3:conj\t_
4\tunbelievably\tunbelievably\tADV\tRB\t_\t5\tadvmod\t_\t_
5\tantidisestablishmentarianism\tx\tNOUN\tNN\t_\t3\tobj\t_\t_

"""
N_ARCS = 9 + 4  # every word but the roots


@pytest.fixture(scope="module")
def bert():
    return tiny.bert_bridge()


def pattern_of(model, batch, layer=0):
    seen = {}

    def keep(pattern, hook):
        seen["pattern"] = pattern.detach().clone()

    attnlens.run_with_hooks(model, batch, [(f"blocks.{layer}.attn.hook_pattern", keep)])
    return seen["pattern"]


def word_attention_loop(pattern, word_ids, n_words):
    """Clark §4.1 by hand: sum over the key word's sub-tokens, mean over the query word's."""
    batch, heads = pattern.shape[:2]
    out = torch.zeros(batch, heads, n_words, n_words, dtype=torch.float64)
    for b in range(batch):
        positions = [[p for p in range(word_ids.shape[1]) if int(word_ids[b, p]) == w] for w in range(n_words)]
        for h in range(heads):
            for i in range(n_words):
                for j in range(n_words):
                    if positions[i]:
                        total = sum(float(pattern[b, h, q, k]) for q in positions[i] for k in positions[j])
                        out[b, h, i, j] = total / len(positions[i])
    return out


@pytest.mark.parametrize("layout", ["papa", "padded"])
def test_word_attention_is_the_plain_loop(bert, layout):
    examples = [
        Words(("Tokenization", "is", "unbelievably", "hard", "!")),
        Words(("antidisestablishmentarianism", "rules")),
    ]
    batch = attnlens.tokenize(bert, examples, max_len=24, layout=layout)
    word_ids = batch.extra["word_ids"]
    sizes = [int((word_ids[0] == w).sum()) for w in range(5)]
    assert max(sizes) >= 3 and int((word_ids[1] == 0).sum()) >= 3  # words of several sub-tokens
    pattern = pattern_of(bert, batch)
    signed = torch.randn_like(pattern)  # effective attention is signed
    for attention in (pattern, signed):
        got = syntax.word_attention(attention, word_ids, 5)
        torch.testing.assert_close(got.double(), word_attention_loop(attention, word_ids, 5), atol=1e-6, rtol=1e-6)
    # rows of a softmax pattern keep the mass the words receive; word 2..4 of example 1 do not exist
    got = syntax.word_attention(pattern, word_ids, 5)
    assert torch.all(got[1, :, 2:] == 0) and torch.all(got[1, :, :, 2:] == 0)
    assert bool((got[0].sum(-1) <= 1 + 1e-5).all())


def test_read_conllu_skips_ranges_and_empty_nodes_and_drops_subtypes(tmp_path):
    first, second = conllu.read_conllu(CONLLU)
    assert second.words == ("do", "n't", "tokenize", "unbelievably", "antidisestablishmentarianism")
    assert second.heads == (2, 2, -1, 4, 2)
    assert first.relations[8] == "obl" and first.heads[8] == 4
    assert (first.line, second.line) == (1, 14)
    path = tmp_path / "two.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    assert conllu.read_conllu(path, limit=1) == [first]
    assert conllu.relations_of([first, second]) == (
        "advmod", "amod", "aux", "case", "det", "nsubj", "obj", "obl", "punct",
    )


@pytest.mark.parametrize(("form", "lemma", "feats"), [("New  York", "New York", "_"),
                                                      ("New  York", "New York", "Number=Sing"),
                                                      ("90000", "90  000", "2")])
def test_read_conllu_takes_a_words_columns_by_tab(form, lemma, feats):
    """CoNLL-U allows spaces in FORM and LEMMA; the ``conllu`` package also split a line at two
    spaces, which shifted the later columns: a TypeError, a valid file refused, or FEATS read as
    the relation. Reference: the tab-separated fields of each line."""
    lines = ["\t".join(["1", form, lemma, "NOUN", "NN", feats, "2", "nsubj", "_", "_"]),
             "\t".join(["2", "sleeps", "sleep", "VERB", "VBZ", "_", "0", "root", "_", "_"])]
    (sentence,) = conllu.read_conllu("\n".join(lines) + "\n\n")
    assert sentence.words == (form, "sleeps") and sentence.heads == (1, -1)
    assert sentence.relations == ("nsubj", "root")


def pointing_pattern(word_ids, targets):
    """A pattern in which every sub-token of word ``w`` attends only to the first sub-token of
    word ``targets[b][w]``; special tokens and padding attend to themselves."""
    batch, positions = word_ids.shape
    out = torch.zeros(batch, positions, positions)
    for b in range(batch):
        first = {}
        for p in range(positions):
            first.setdefault(int(word_ids[b, p]), p)
        for q in range(positions):
            word = int(word_ids[b, q])
            out[b, q, q if word < 0 else first[targets[b][word]]] = 1.0
    return out


def replacing(layer_heads, patterns):
    """``fwd_hooks`` replacing head ``h`` of layer ``l`` by ``patterns[(l, h)]``."""
    hooks = []
    for layer, head in layer_heads:
        def hook(pattern, hook, head=head, layer=layer):
            pattern = pattern.clone()
            pattern[:, head] = patterns[(layer, head)].to(pattern)
            return pattern

        hooks.append((f"blocks.{layer}.attn.hook_pattern", hook))
    return hooks


def test_a_head_attending_to_syntactic_heads_scores_one(bert):
    sentences = conllu.read_conllu(CONLLU)
    # the default layout of the analysis: the model's ordinary input
    batch = attnlens.tokenize(bert, [Words(s.words) for s in sentences], max_len=32, layout="padded")
    word_ids = batch.extra["word_ids"]
    # head 2 of layer 1: each word attends to its syntactic head (the root to itself)
    to_heads = [[h if h >= 0 else i for i, h in enumerate(s.heads)] for s in sentences]
    # head 3 of layer 1: "fox" attends to "The" and "dog" to "the" (their det), others to themselves
    to_det = [list(range(len(s))) for s in sentences]
    to_det[0][3], to_det[0][8] = 0, 6
    hooks = replacing([(1, 2), (1, 3)], {
        (1, 2): pointing_pattern(word_ids, to_heads), (1, 3): pointing_pattern(word_ids, to_det),
    })

    table = syntax.dependency_heads(bert, CONLLU, max_len=32, batch_size=8, hooks=hooks, progress=False)
    to_head = table[table.direction == "dependent->head"].set_index("relation")
    assert (to_head.accuracy == 1.0).all()
    assert to_head.loc["all relations", "count"] == N_ARCS
    assert (to_head.loc["all relations", "best_layer"], to_head.loc["all relations", "best_head"]) == (1, 2)
    assert to_head.loc["amod", "count"] == 3 and to_head.loc["det", "count"] == 2
    # baseline: quick -> fox (+2), brown -> fox (+1), lazy -> dog (+1)
    assert to_head.loc["amod", "baseline_offset"] == 1
    assert to_head.loc["amod", "baseline_accuracy"] == pytest.approx(2 / 3)
    assert to_head.loc["amod", "beats_baseline"]
    to_dependent = table[table.direction == "head->dependent"].set_index("relation")
    assert to_dependent.loc["det", "accuracy"] == 1.0
    # fox has two amod dependents: the head word's one prediction gets at most one of them
    assert to_dependent.loc["amod", "accuracy"] < 1.0
    assert list(table.columns) == list(syntax.COLUMNS)
    assert list(table["count"]) == sorted(table["count"], reverse=True)
    assert table.attrs["sentences"] == 2 and table.attrs["skipped"] == 0
    assert table.attrs["view"] == "standard"

    # the same counts through passes.run, head by head: the hooked heads are exact
    counts = syntax.DependencyCounts(sentences, 2, 4)
    passes.run(bert, [Words(s.words) for s in sentences], [counts], max_len=32, layout="padded",
               hooks=hooks, progress=False)
    det, amod = counts.relations.index("det"), counts.relations.index("amod")
    assert torch.equal(counts.correct[:, 0, 1, 2], counts.arcs)
    assert int(counts.correct[det, 1, 1, 3]) == 2 and int(counts.correct[amod, 1, 1, 3]) == 0
    assert int(counts.arcs.sum()) == N_ARCS and int(counts.dropped) == 0

    # an accumulator over two halves of the corpus, merged, is the one over the whole
    halves = []
    for part in ([sentences[0]], [sentences[1]]):
        half = syntax.DependencyCounts(part, 2, 4, relations=counts.relations)
        passes.run(bert, [Words(s.words) for s in part], [half], max_len=32, layout="papa", progress=False)
        halves.append(half)
    whole = syntax.DependencyCounts(sentences, 2, 4)
    passes.run(bert, [Words(s.words) for s in sentences], [whole], max_len=32, layout="papa", progress=False)
    merged = halves[0].merge(halves[1])
    for key, value in whole.state_dict().items():
        assert torch.equal(merged.state_dict()[key], value), key


def test_effective_and_papa_views(bert):
    from attnlens import papa

    effective = syntax.dependency_heads(bert, CONLLU, view="effective", max_len=32, progress=False)
    assert effective.attrs["view"] == "effective"
    assert effective["count"].iloc[0] == N_ARCS
    constants = papa.fit(bert, tiny.CORPUS, max_len=32, progress=False)
    constant = syntax.dependency_heads(bert, CONLLU, view=constants, progress=False)
    assert (constant.attrs["view"], constant.attrs["max_len"]) == ("papa", 32)
    assert constant["count"].iloc[0] == N_ARCS
    with pytest.raises(ValueError, match="fitted with max_len=32, not 64"):
        syntax.dependency_heads(bert, CONLLU, view=constants, max_len=64, progress=False)


def test_bad_inputs(bert, tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.conllu not found"):
        syntax.dependency_heads(bert, tmp_path / "nowhere.conllu", progress=False)
    text = tmp_path / "text.conllu"
    text.write_text("Just a sentence.\nAnother one.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"text.conllu, line 1: not a CoNLL-U word line \(1 tab"):
        syntax.dependency_heads(bert, text, progress=False)
    no_tree = tmp_path / "tagged.conllu"
    no_tree.write_text(
        "# a POS-tagged file without trees\n1\tHello\thello\tINTJ\tUH\t_\t_\t_\t_\t_\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"tagged.conllu, line 2: word 1 has no dependency .*HEAD"):
        syntax.dependency_heads(bert, no_tree, progress=False)
    outside = CONLLU.replace("4\tdet\t_", "40\tdet\t_", 1)
    with pytest.raises(ValueError, match="line 3: HEAD 40 points past"):
        conllu.read_conllu(outside)
    with pytest.raises(ValueError, match="has no sentence"):
        conllu.read_conllu("# only a comment\n\n")
    for view in ("papa", "attention", 3):
        with pytest.raises(ValueError, match="Unknown view .* use 'standard'"):
            syntax.dependency_heads(bert, CONLLU, view=view, progress=False)


def test_a_sentence_longer_than_max_len_is_skipped_and_counted(bert):
    words = " ".join(["word"] * 40).split()
    long = "".join(f"{i}\t{w}\t{w}\tNOUN\tNN\t_\t{1 if i > 1 else 0}\t{'root' if i == 1 else 'dep'}\t_\t_\n"
                   for i, w in enumerate(words, 1))
    text = CONLLU + long + "\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = syntax.dependency_heads(bert, text, max_len=32, progress=False)
    skipped = [w for w in caught if "skipped" in str(w.message)]
    assert len(skipped) == 1 and "1 of 3 sentences" in str(skipped[0].message)
    assert "max_len=32" in str(skipped[0].message)
    assert (table.attrs["skipped"], table.attrs["sentences"]) == (1, 2)
    assert "dep" not in set(table.relation) and table["count"].iloc[0] == N_ARCS


@pytest.mark.slow
def test_minilm_heads_beat_the_offset_baseline_on_ud_english(minilm):
    path = data_file("ud_english_ewt/en_ewt-ud-dev.conllu")
    table = syntax.dependency_heads(minilm, path, limit=300, layout="padded", progress=False)
    with pd_options():
        print(f"\n{table.attrs}\n{table.head(30).to_string()}")
    assert table.attrs["sentences"] + table.attrs["skipped"] + table.attrs["blank"] == 300
    frequent = table[table.relation.isin(["det", "amod", "nsubj", "obj"])]
    assert len(frequent) == 8 and (frequent["count"] >= 50).all()
    beating = set(frequent[frequent.beats_baseline].relation)
    assert len(beating) >= 2, frequent.to_string()
    # det: one head should find the noun far better than chance and than the best offset
    det = frequent[(frequent.relation == "det") & (frequent.direction == "dependent->head")].iloc[0]
    assert det.accuracy > 0.6


def pd_options():
    import pandas as pd

    return pd.option_context("display.width", 200, "display.max_columns", 20, "display.precision", 3)


#: a sentence whose first word's head is the second: on a decoder the first word sees no other
#: word, and a later word's 0 once won its row's argmax (every head "found" the nsubj arc)
FIRST_WORD = """\
1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_
2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_
3\tloudly\tloudly\tADV\tRB\t_\t2\tadvmod\t_\t_
4\t.\t.\tPUNCT\t.\t_\t2\tpunct\t_\t_

"""


def test_a_decoders_words_predict_only_earlier_words():
    """On a decoder (tiny GPT-2) every head's counts equal a plain loop over HF-eager word
    attention (:func:`word_attention_loop`) whose argmax runs over the earlier words only, the
    first word predicting nothing; the first word's nsubj arc is never a hit (it was, for every
    head, when a later word's 0 could win the argmax). A word's row holds no weight on later words
    (causal attention), which the loop checks too."""
    gpt2 = tiny.gpt2_bridge()
    text = CONLLU + FIRST_WORD
    sentences = conllu.read_conllu(text)
    counts = syntax.DependencyCounts(sentences, gpt2.cfg.n_layers, gpt2.cfg.n_heads, causal=True)
    corpus = [Words(s.words) for s in sentences]
    passes.run(gpt2, corpus, [counts], max_len=48, progress=False)
    batch = attnlens.tokenize(gpt2, corpus, max_len=48)
    word_ids, width = batch.extra["word_ids"], max(len(s) for s in sentences)
    expected = torch.zeros_like(counts.correct)
    for layer in range(gpt2.cfg.n_layers):
        words = word_attention_loop(pattern_of(gpt2, batch, layer), word_ids, width)
        for b, sentence in enumerate(sentences):
            n = len(sentence)
            assert torch.all(words[b, :, :n, :n].triu(1) == 0)
            for head in range(gpt2.cfg.n_heads):
                predicted = [max(range(w), key=lambda j: (float(words[b, head, w, j]), -j)) if w else -1
                             for w in range(n)]
                for dependent, parent, relation in sentence.arcs():
                    r = counts.relations.index(relation)
                    expected[r, 0, layer, head] += predicted[dependent] == parent
                    expected[r, 1, layer, head] += predicted[parent] == dependent
    assert torch.equal(counts.correct, expected)
    nsubj = counts.relations.index("nsubj")
    assert int(counts.correct[nsubj, 0].max()) <= 1  # the fox's nsubj arc may be found; the dogs' never
    table = syntax.dependency_heads(gpt2, text, max_len=48, progress=False)  # the model's causality
    found = table[(table.direction == "dependent->head") & (table.relation == "nsubj")]
    assert float(found.accuracy.iloc[0]) * int(found["count"].iloc[0]) == int(counts.correct[nsubj, 0].max())
