"""What a notebook user runs into: cells run twice, the wrong kind of argument, short reprs.

References: the first run's own results (a second run must give the same bridge and numbers), the
error messages' promise to name the problem and the fix, and plain sizes for reprs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import attnlens
from attnlens import papa
from attnlens.methods import effective
from tests import tiny
from tests.typechecks import unchecked

TEXTS = tiny.CORPUS[:4]


@pytest.fixture()
def hf_bert():
    return tiny.tiny_bert()


def test_loading_the_same_hugging_face_model_twice_returns_its_bridge(hf_bert, minilm):
    """The first load wraps the model's layers; wrapping them again would give a bridge whose
    hook_pattern never fires, so a PAPA intervention would silently change nothing. Reference: the
    same intervention on a separately loaded copy of the same weights."""
    first = attnlens.load(hf_bert, tokenizer=tiny.bert_tokenizer())
    again = attnlens.load(hf_bert, tokenizer=tiny.bert_tokenizer())
    reference = tiny.bert_bridge()
    assert again is first

    def effect(model):
        batch = attnlens.tokenize(model, TEXTS, max_len=16)  # the PAPA layout of the constants
        with torch.no_grad():
            plain = model(batch.input_ids, **batch.model_kwargs())
            with papa.intervention(model, papa.uniform(model, max_len=16), heads="all"):
                return model(batch.input_ids, **batch.model_kwargs()) - plain

    expected = effect(reference)
    assert expected.abs().max() > 1e-6
    torch.testing.assert_close(effect(again), expected, atol=1e-7, rtol=0)
    with pytest.raises(ValueError, match="already loaded"):
        attnlens.load(hf_bert, dtype=torch.float64)
    with pytest.raises(ValueError, match="already wrapped by a TransformerBridge"):
        attnlens.load(minilm.original_model, tokenizer=minilm.tokenizer)  # booted by name, not by load(object)


def test_compare_twice_on_a_hugging_face_model(hf_bert):
    attnlens.load(hf_bert, tokenizer=tiny.bert_tokenizer())  # compare(hf) needs the tokenizer once
    first = attnlens.compare(hf_bert, "standard", corpus=TEXTS, max_len=16, progress=False)
    second = attnlens.compare(hf_bert, "standard", corpus=TEXTS, max_len=16, progress=False)
    pd.testing.assert_frame_equal(first.table, second.table, check_exact=True)


@pytest.mark.parametrize("table", [pd.DataFrame({"text": TEXTS, "label": [0, 1, 0, 1]}), {"text": TEXTS}])
def test_a_whole_table_as_corpus_is_refused(minilm, table):
    """Iterating a DataFrame or a dict gives its column names: two 'texts' named text and label."""
    for run in (
        lambda: attnlens.compare(minilm, "standard", corpus=table, progress=False),
        lambda: papa.fit(minilm, table, max_len=16, progress=False),
        lambda: effective.statistics(minilm, table, max_len=16, progress=False),
    ):
        with pytest.raises(TypeError, match=r"one column .*corpus\['text'\]"):
            run()


def test_max_len_and_counts_of_any_integer_type_and_clear_errors_otherwise(minilm):
    as_int = attnlens.tokenize(minilm, TEXTS, max_len=16)
    as_numpy = attnlens.tokenize(minilm, TEXTS, max_len=np.int64(16))
    assert torch.equal(as_int.input_ids, as_numpy.input_ids) and as_numpy.max_len == 16
    assert isinstance(as_numpy.max_len, int)
    for bad in (16.0, None, "16", True):
        with unchecked(), pytest.raises(TypeError, match="max_len must be a whole number"):
            attnlens.tokenize(minilm, TEXTS, max_len=bad)
    with unchecked(), pytest.raises(TypeError, match="max_len must be a whole number"):
        papa.fit(minilm, TEXTS, max_len=None, progress=False)
    with pytest.raises(ValueError, match="max_len=-5 leaves no room"):
        papa.fit(minilm, TEXTS, max_len=-5, progress=False)
    with pytest.raises(ValueError, match="max_len=0 leaves no room"):
        attnlens.compare(minilm, "standard", corpus=TEXTS, max_len=0, progress=False)
    with unchecked(), pytest.raises(ValueError, match="n_examples=2.0 should be a whole number"):
        attnlens.compare(minilm, "standard", corpus=TEXTS, n_examples=2.0, progress=False)


def test_a_hugging_face_model_where_a_bridge_is_needed_says_to_load_it(hf_bert):
    constants = papa.uniform(tiny.bert_bridge(), max_len=16)
    for run in (
        lambda: papa.fit(hf_bert, TEXTS, max_len=16, progress=False),
        lambda: papa.intervention(hf_bert, constants).__enter__(),
        lambda: papa.select_heads("random", fraction=0.5, model=hf_bert),
        lambda: effective.hooked(hf_bert).__enter__(),
        lambda: attnlens.tokenize(hf_bert, TEXTS, max_len=16),
    ):
        with pytest.raises(TypeError, match=r"attnlens\.load"):
            run()


def test_reprs_are_short_and_say_the_shapes(minilm):
    batch = attnlens.tokenize(minilm, TEXTS, max_len=16, layout="padded")
    run = effective.run(minilm, batch)
    stats = effective.statistics(minilm, TEXTS, max_len=16, progress=False)
    assert repr(batch).startswith("Batch(4 texts x") and len(repr(batch)) < 200
    assert f"{list(run.standard.shape)}" in repr(run) and len(repr(run)) < 300
    assert "to_cls" in repr(stats) and "[6, 12]" in repr(stats) and len(repr(stats)) < 400


def test_trainable_constants_follow_the_patterns_device():
    """The pattern goes where the model's tensors are (the mask's device), not where the trained
    logits live: on a GPU model a CPU pattern would be mixed with GPU ones. ``meta`` stands in for
    a second device."""
    from attnlens.methods.papa.replace import softmax_pattern

    logits = torch.randn(2, 5, 5, requires_grad=True)
    pattern = softmax_pattern(logits, torch.ones(1, 5, dtype=torch.bool, device="meta"))
    assert pattern.device.type == "meta" and pattern.shape == (1, 2, 5, 5)


# -- a notebook run in a fresh kernel (nbclient) --------------------------------------------------

NOTEBOOK_CELLS = [
    "import attnlens\nfrom tests import tiny\n"
    "model = tiny.bert_bridge()",
    'c = attnlens.compare(model, "papa", "effective", corpus=tiny.CORPUS, max_len=16)',
    "c",
    "c.figures",
    'c.figures["distance_from_standard"]',
    'c.figures["dominant_target"]',
    "c.table.head(3)",
]
#: what the outputs may weigh beside plotly.js (included once) and the shown figures' JSON
#: (twice: plotly's mimetype and its HTML view): the summaries, tables and progress bars
SMALL_OUTPUTS = 200_000


@pytest.fixture(scope="module")
def executed_notebook():
    """The cells above run in a fresh Jupyter kernel (a notebook's own process, from this
    checkout, offline) with nbclient; returns the executed notebook."""
    import os
    from pathlib import Path

    nbclient = pytest.importorskip("nbclient", reason="pip install nbclient (the dev extra has it)")
    nbformat = pytest.importorskip("nbformat", reason="pip install nbformat (the dev extra has it)")
    pytest.importorskip("ipykernel", reason="pip install ipykernel (the dev extra has it)")
    root = Path(__file__).resolve().parents[2]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    env = {key: value for key, value in os.environ.items() if key != "PLOTLY_RENDERER"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(root)}},
    )
    client.execute(env=env)
    return notebook


def _outputs(notebook, index: int) -> list[dict]:
    return notebook.cells[index].outputs


@pytest.mark.slow
def test_a_fresh_kernel_notebook_is_light_and_prints_no_warning(executed_notebook):
    """plotly.js is in the notebook once (two figures shown), the comparison's display is a
    small summary, and nothing printed is a warning or an error. Budget: plotly.js once + the
    two figures' JSON twice + 200 kB; today's 8 MB came from plotly.js inlined at every display."""
    import json

    import nbformat
    from plotly.offline import get_plotlyjs

    notebook = executed_notebook
    text = nbformat.writes(notebook)
    for cell in notebook.cells:
        for output in cell.outputs:
            assert output.output_type != "error", output
            if output.output_type == "stream":
                assert "warning" not in output.text.lower(), output.text
    assert text.count("plotly.js v") == 1  # plotly.js's own banner: included once
    figures = [
        json.dumps(output.data["application/vnd.plotly.v1+json"])
        for index in (4, 5) for output in _outputs(notebook, index)
        if "application/vnd.plotly.v1+json" in output.get("data", {})
    ]
    assert len(figures) == 2
    # plotly.js as the .ipynb stores it: a JSON string (quotes, backslashes and newlines escaped)
    budget = len(json.dumps(get_plotlyjs())) + 2 * sum(map(len, figures)) + SMALL_OUTPUTS
    assert len(text) < budget, (len(text), budget)
    assert len(text) < 6_000_000
    summary = _outputs(notebook, 2)[0].data["text/html"]
    assert len(summary) < 20_000 and "<script" not in summary and "attnlens comparison" in summary
    table = _outputs(notebook, 3)[0].data["text/html"]
    assert "distance_from_standard" in table and "<script" not in table and len(table) < 20_000
    for index in (4, 5):  # each figure also has an HTML view (what nbconvert keeps)
        data = [o for o in _outputs(notebook, index) if "text/html" in o.get("data", {})][-1].data
        assert "Plotly.newPlot" in data["text/html"] and "application/vnd.plotly.v1+json" in data
    assert any(o.output_type == "stream" and o.name == "stderr" and "compare (" in o.text
               for o in _outputs(notebook, 1))  # the text progress bar was there


@pytest.mark.slow
def test_the_notebooks_figures_survive_nbconvert_to_html(executed_notebook, tmp_path):
    """The executed notebook exported by nbconvert's HTML exporter (what a reader shares) and
    opened offline in headless Chromium draws both figures: their text/html views carry
    plotly.js, so no CDN is needed."""
    import shutil
    import subprocess

    from tests.conftest import required

    nbconvert = pytest.importorskip("nbconvert", reason="pip install nbconvert (the dev extra has it)")
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    if chromium is None:
        required("headless Chromium", "apt-get install -y chromium (.ci/run does it)")
    body, _ = nbconvert.HTMLExporter().from_notebook_node(executed_notebook)
    page = tmp_path / "notebook.html"
    page.write_text(body, encoding="utf-8")
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--host-resolver-rules=MAP * ~NOTFOUND",
         "--virtual-time-budget=15000", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    drawn = result.stdout.count('class="main-svg"')
    assert drawn >= 6, (drawn, result.stderr[-2000:])  # 3 svg.main-svg layers per drawn figure, 2 figures


@pytest.mark.slow
def test_the_quick_start_notebook_in_a_fresh_kernel_is_light_and_prints_no_warning():
    """The gallery's quick start (examples/01_quickstart.ipynb) as a user runs it: a fresh kernel,
    no renderer set, no warning filter. Nothing printed is a warning or an error, and the executed
    notebook holds plotly.js at most once: budget plotly.js + 1 MB for the figures and tables."""
    import json
    import os
    from pathlib import Path

    from plotly.offline import get_plotlyjs

    nbclient = pytest.importorskip("nbclient", reason="pip install nbclient (the dev extra has it)")
    nbformat = pytest.importorskip("nbformat", reason="pip install nbformat (the dev extra has it)")
    root = Path(__file__).resolve().parents[2]
    notebook = nbformat.read(root / "examples" / "01_quickstart.ipynb", as_version=4)
    env = {key: value for key, value in os.environ.items()
           if key not in ("PLOTLY_RENDERER", "PYTHONWARNINGS")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(root / "examples")}})
    client.execute(env=env)
    text = nbformat.writes(notebook)
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", output
            if output.output_type == "stream":
                assert "warning" not in output.text.lower(), output.text
    assert text.count("plotly.js v") <= 1
    assert len(text) < len(json.dumps(get_plotlyjs())) + 1_000_000, len(text)
