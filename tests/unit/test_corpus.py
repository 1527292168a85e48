"""Reading corpus tables (attnlens.core.corpus.read_corpus): headers, columns, big cells, pairs."""

from __future__ import annotations

import csv

import pytest

from attnlens.cli import main
from attnlens.core import corpus
from attnlens.core.corpus import CorpusError, read_corpus, resolve_corpus
from tests.conftest import data_file


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_headerless_table_with_several_columns_is_refused(tmp_path):
    """CoLA's layout (source, label, mark, sentence; no header): which column holds the texts is
    unknown, so the file is refused instead of reading the source codes and losing row 1."""
    rows = "gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank.\n"
    path = write(tmp_path / "cola.tsv", rows)
    with pytest.raises(CorpusError) as error:
        read_corpus(path)
    message = str(error.value)
    assert "\n" not in message
    for part in (str(path), "4 columns", "gj04", "Our friends", "header", "sentence", ".txt"):
        assert part in message
    with pytest.raises(CorpusError, match="2 columns"):
        read_corpus(write(tmp_path / "plain.csv", "hello there,1\ngood day,0\n"))


def test_headerless_table_with_one_column_is_one_text_per_row(tmp_path):
    texts = read_corpus(write(tmp_path / "a.tsv", "hello there\ngood day\n"))
    assert texts == ["hello there", "good day"]
    texts = read_corpus(write(tmp_path / "a.csv", '"hello, there"\ngood day\n'))
    assert texts == ["hello, there", "good day"]
    # a known column name in row 1 is a header, also in a one-column file
    assert read_corpus(write(tmp_path / "b.csv", "Text\nhello there\n")) == ["hello there"]


def test_column_names_match_whatever_their_case(tmp_path):
    assert read_corpus(write(tmp_path / "a.csv", "label,Text\n1,hello world\n0,good day\n")) == [
        "hello world",
        "good day",
    ]
    assert read_corpus(write(tmp_path / "b.tsv", "id\t SENTENCE \n7\tgood film\n")) == ["good film"]


def test_cells_over_the_csv_modules_default_limit_are_read(tmp_path):
    """csv refuses cells over 128 KiB unless its (process-wide) limit is raised; read_corpus
    raises it for the read only and puts the previous value back."""
    long_text = "word " * 40_000 + "end"  # 200 KB
    before = csv.field_size_limit()
    assert len(long_text) > before
    csv_path = write(tmp_path / "big.csv", f'text,label\n"{long_text}",1\nshort,0\n')
    tsv_path = write(tmp_path / "big.tsv", f"label\tsentence\n1\t{long_text}\n0\tshort\n")
    assert read_corpus(csv_path) == [long_text, "short"]
    assert read_corpus(tsv_path) == [long_text, "short"]
    assert csv.field_size_limit() == before


def test_csv_errors_become_one_line_corpus_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "_FIELD_LIMIT", 10, raising=False)  # a cell limit of 10 characters
    before = csv.field_size_limit()
    path = write(tmp_path / "t.csv", "text\nshort\nthis cell is too long\n")
    with pytest.raises(CorpusError) as error:
        read_corpus(path)
    message = str(error.value)
    assert "\n" not in message
    for part in (str(path), "row 3", "field larger than field limit"):
        assert part in message
    assert csv.field_size_limit() == before


@pytest.mark.parametrize(
    "header",
    [
        "sentence1\tsentence2\tlabel",
        "Sentence1\tSENTENCE2\tlabel",
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
        "quality\t#1 id\t#2 id\t#1 string\t#2 string",
    ],
)
def test_sentence_pair_tables_give_pairs(tmp_path, header):
    rows = [("A man sings.", "Someone sings."), ("It rains.", "The sun shines."), (" ", " ")]
    if header.lower().startswith("quality"):
        lines = [f"1\t1\t2\t{a}\t{b}" for a, b in rows]
    else:
        lines = [f"{a}\t{b}\t1" for a, b in rows]
    path = write(tmp_path / "pairs.tsv", "\n".join([header, *lines]) + "\n")
    expected = [("A man sings.", "Someone sings."), ("It rains.", "The sun shines.")]
    assert read_corpus(path) == expected  # the blank pair is dropped
    assert resolve_corpus(path) == expected
    half = write(tmp_path / "half.csv", "sentence1,sentence2\nalone, \n")
    assert read_corpus(half) == [("alone", "")]  # one blank sentence keeps the pair


def test_real_glue_files(sst2_sentences, mrpc_pairs):
    """SST-2 (`sentence` column) and MRPC (`#1 String`/`#2 String`, with a BOM) as the conftest
    fixtures read them with csv.DictReader; CoLA (no header, four columns) is refused."""
    assert read_corpus(data_file("sst2/dev.tsv")) == [text.strip() for text in sst2_sentences]
    pairs = [(first.strip(), second.strip()) for first, second in mrpc_pairs]
    assert read_corpus(data_file("mrpc/dev.tsv")) == pairs
    with pytest.raises(CorpusError, match="has 4 columns and no header"):
        read_corpus(data_file("cola/glue/dev.tsv"))


def test_command_line_reports_a_headerless_table_in_one_line(tmp_path, capsys):
    path = write(tmp_path / "plain.csv", "hello there,1\ngood day,0\n")
    out = tmp_path / "c.safetensors"
    with pytest.raises(SystemExit) as exit_:
        main(["fit-papa", "--corpus", str(path), "--max-len", "16", "--quiet", "--out", str(out)])
    assert exit_.value.code == 2
    stderr = capsys.readouterr().err.strip()
    assert "\n" not in stderr
    assert stderr.startswith("attnlens: error: corpus file") and "2 columns" in stderr
    assert not out.exists()


@pytest.mark.parametrize("rows", [["0"], ["great\tfun\tfilm\t1"]])
def test_a_row_not_as_wide_as_its_header_is_refused_by_number(tmp_path, rows):
    """A row missing its text cell was dropped, and one with a stray tab lost the rest of its
    text, neither counted among the dropped texts; each is now refused with its row's number."""
    path = write(tmp_path / "reviews.tsv", "label\tsentence\n1\tgood\n" + "\n".join(rows) + "\n\n")
    with pytest.raises(CorpusError, match=r"row 3 has \d cells where its header has 2"):
        read_corpus(path)
    assert read_corpus(write(tmp_path / "fine.tsv", "label\tsentence\n1\tgood\n\n0\tbad\n")) == ["good", "bad"]


def test_a_table_given_as_txt_is_read_as_a_table():
    """MRPC's release file (``msr_paraphrase_train.txt``: a TSV with a header naming
    ``#1 String`` and ``#2 String``) was read as raw lines, its header a text and each row one
    text of IDs and both sentences; it is now read as the pairs its ``.tsv`` copy gives
    (reference: csv's reader on the file, the pair columns picked by the header's names)."""
    path = data_file("mrpc/msr_paraphrase_train.txt")
    with open(path, encoding="utf-8-sig", newline="") as file:
        rows = list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))
    i, j = rows[0].index("#1 String"), rows[0].index("#2 String")
    texts, expected = read_corpus(path), [(row[i].strip(), row[j].strip()) for row in rows[1:] if row]
    assert (len(texts), texts[0]) == (len(expected), expected[0])  # a short message if not
    assert texts == expected
