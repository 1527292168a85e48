"""``attnlens curve`` with the options that rewrite docs/papa_curve.csv and Table 1 gives the
Python call's curve, on a small one: MiniLM, SST-2 and MRPC (a pair task, whose constants are
fitted on its own training pairs), 48 training and 24 evaluation examples, fractions 0 and 1, one
seed, the zeros baseline, the MLM probe on 6 WikiText-2 paragraphs; and ``--combine`` joins the
table split by task into the same table."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from attnlens import cli
from attnlens.cli.jobs import common
from attnlens.evaluation import conventions
from attnlens.evaluation.curve import Curve, curve
from attnlens.evaluation.curve_inputs import (
    LM_MIN_WORDS,
    constants_by_task,
    missing_tasks,
    wikitext,
)
from attnlens.evaluation.table import PapaTable
from attnlens.methods.papa import PapaConstants, fitting
from tests.conftest import DATA, data_file

pytestmark = pytest.mark.slow

TRAIN, EVAL, LM = 48, 24, 6
OPTIONS = ["--train-limit", str(TRAIN), "--eval-limit", str(EVAL), "--fractions", "0,1", "--seeds", "1",
           "--baselines", "zeros", "--device", "cpu", "--quiet"]


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A data folder: the first 60 lines of WikiText-2's validation and test files (headings and
    blank lines among them), and the real SST-2 and MRPC; its own feature cache."""
    monkeypatch.setenv("ATTNLENS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "data"
    (folder / "wikitext2").mkdir(parents=True)
    for split in ("valid", "test"):
        lines = data_file(f"wikitext2/{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (folder / "wikitext2" / f"{split}.txt").write_text("".join(lines[:60]), encoding="utf-8")
    for task in ("sst2", "mrpc"):
        (folder / task).symlink_to(DATA / task)
    return folder


def test_the_cli_curve_is_the_python_call(minilm, data, tmp_path):
    """The CLI's CSV, Table 1 and constants equal the Python call's: the same constants
    (fitted on the same paragraphs), the same points, every digit (the same features and seeds
    on the same CPU; the tolerance is 0)."""
    out, table = tmp_path / "curve.csv", tmp_path / "table.csv"
    saved = tmp_path / "c.safetensors"
    assert cli.main(["curve", "--fit-wikitext", "--save-constants", str(saved), "--data-dir", str(data),
                     "--lm-wikitext", str(LM), "--out", str(out), "--table", str(table),
                     "--json", str(tmp_path / "curve.json"), "--task", "sst2", "--task", "mrpc",
                     *OPTIONS]) == 0

    paragraphs = wikitext(data)
    assert 0 < len(paragraphs) < 120 and not any(p.startswith("=") or not p for p in paragraphs)
    constants = fitting.fit(minilm, paragraphs, progress=False)
    by_task = constants_by_task(minilm, constants, ["sst2", "mrpc"], data_dir=data, train_limit=TRAIN,
                                progress=False)
    assert by_task["sst2"] is constants and by_task["lm"] is constants
    assert by_task["mrpc"].pairs and by_task["mrpc"].n_examples == TRAIN  # fitted on MRPC's pairs
    texts = wikitext(data, ["test"], min_words=LM_MIN_WORDS, limit=LM)
    assert len(texts) == LM and all(len(text.split()) > LM_MIN_WORDS for text in texts)
    expected = curve(minilm, by_task, ["sst2", "mrpc"], fractions=[0.0, 1.0], baselines=["zeros"], seeds=1,
                     data_dir=data, train_limit=TRAIN, eval_limit=EVAL, lm_texts=texts, progress=False)

    written = pd.read_csv(out)
    assert list(dict.fromkeys(written["task"])) == ["sst2", "mrpc", "lm"]
    pd.testing.assert_frame_equal(written, pd.read_csv(_csv(expected, tmp_path / "expected.csv")), rtol=0, atol=0)
    assert Curve.read_csv(out).to_markdown() == expected.to_markdown()
    expected_table = PapaTable.from_curve(expected, unavailable=missing_tasks(expected, data))
    assert set(expected_table.table.loc[expected_table.table["score"].isna(), "task"]) == {"cola", "mnli", "ner", "pos"}
    pd.testing.assert_frame_equal(pd.read_csv(table), pd.read_csv(io.StringIO(expected_table.table.to_csv(index=False))),
                                  rtol=0, atol=0)
    assert table.with_suffix(".md").read_text(encoding="utf-8") == expected_table.to_markdown() + "\n"
    relative = table.with_name(table.stem + "_relative.md").read_text(encoding="utf-8")
    assert relative == expected_table.to_markdown(relative=True) + "\n" and "not available" in relative
    versus = table.with_name(table.stem + "_versus_average.md").read_text(encoding="utf-8")
    assert versus == expected_table.to_markdown(versus_average=True) + "\n" and "| zeros |" in versus
    assert (PapaConstants.load(saved).mean == constants.mean).all()
    assert Curve.from_json(tmp_path / "curve.json").settings["baselines"] == ["zeros"]

    # the table split by task, each part Holm-adjusted on its own as a run of its tasks would be,
    # then joined by --combine: one family again, the same table and Table 1
    parts = [tmp_path / "sst2.csv", tmp_path / "mrpc-lm.csv"]
    conventions.apply(written[written["task"] == "sst2"]).to_csv(parts[0], index=False)
    conventions.apply(written[written["task"] != "sst2"]).to_csv(parts[1], index=False)
    joined, joined_table = tmp_path / "joined.csv", tmp_path / "joined-table.csv"
    assert cli.main(["curve", "--combine", *map(str, parts), "--out", str(joined), "--table", str(joined_table),
                     "--data-dir", str(data), "--quiet"]) == 0  # --data-dir: which missing tasks have no data
    assert joined.read_bytes() == out.read_bytes() and joined_table.read_bytes() == table.read_bytes()


def test_bad_curve_options_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    constants = tmp_path / "c.safetensors"
    constants.write_bytes(b"")
    cases = [
        (["--task", "sst2"], "--constants FILE (from 'attnlens fit-papa') or --fit-wikitext"),
        (["--fit-wikitext", "--task", "sst2"], "--fit-wikitext reads --data-dir/wikitext2/valid.txt: give --data-dir"),
        (["--constants", str(constants), "--task", "sst2", "--lm-wikitext", "4", "--data-dir", str(tmp_path)],
         "is not a file"),
        (["--constants", str(constants), "--task", "sst2", "--baselines", "zero"], "--baselines 'zero'"),
        (["--constants", str(constants), "--task", "sst2", "--table", "t.csv", "--fractions", "0,0.5"],
         "add 1 to --fractions"),
        (["--constants", str(constants), "--task", "sst2", "--save-constants", "s.safetensors"],
         "--save-constants s.safetensors would be unused"),
        (["--constants", str(constants)], "required: --task"),
        (["--combine", "a.csv", "--task", "sst2"], "--combine runs nothing: --task would be unused"),
        (["--combine", str(tmp_path / "none.csv")], "--combine: file not found"),
    ]
    monkeypatch.chdir(tmp_path)
    for argv, expected in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["curve", *argv, "--out", "c.csv", "--quiet"])
        assert exit_info.value.code == 2, argv
        err = capsys.readouterr().err.strip()
        assert expected in err and "\n" not in err, (argv, err)


def _csv(result: Curve, path):
    result.to_csv(path)
    return path
