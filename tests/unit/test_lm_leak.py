"""The documented curve's LM score is not leaked: the constants are fitted on paragraphs that
are disjoint from the paragraphs the MLM probe is scored on (issue 60: the constants were once
fitted on WikiText-2 valid *and* test, which held the 400 scored paragraphs)."""

from __future__ import annotations

from pathlib import Path

from attnlens.evaluation import curve_inputs
from tests.conftest import DATA, data_file


def _lines(split: str) -> set[str]:
    """Every non-blank line of the raw split file, stripped (the reference: no filtering); a
    missing file skips locally and fails in CI (:func:`tests.conftest.data_file`)."""
    text = data_file(f"wikitext2/{split}.txt").read_text(encoding="utf-8")
    return {line.strip() for line in text.splitlines() if line.strip()}


def test_the_constants_never_see_a_scored_paragraph():
    test_lines = _lines("test")
    fitted = curve_inputs.constant_texts(DATA)
    scored = curve_inputs.lm_texts(DATA)
    assert len(scored) == curve_inputs.LM_PARAGRAPHS and len(fitted) > 1000
    assert not set(fitted) & set(scored)
    # against the raw files: every scored paragraph is a test line, and no constant text is one
    assert set(scored) <= test_lines
    assert not set(fitted) & test_lines


def test_the_documented_curve_reads_these_functions():
    """The command of docs/probing.md fits on constant_texts and scores lm_texts (the CLI's
    source names them), so the test above covers what it runs."""
    source = Path(curve_inputs.__file__).resolve().parents[1] / "cli"
    text = "".join(path.read_text(encoding="utf-8") for path in source.rglob("*.py"))
    assert "constant_texts(" in text and "lm_texts(" in text
