"""attnlens.evaluation.claims: the sentences follow the test columns and nothing else (the one
test convention), read back from a CSV as the docs read them."""

from __future__ import annotations

import pandas as pd

from attnlens.evaluation.curve import Curve
from attnlens.evaluation.table import PapaTable

NAN = float("nan")


def test_a_curve_claims_what_its_tests_show(tmp_path):
    """Equivalence up to the last point of an unbroken run of equivalent points (0.5: 0.875 is
    neither, so 1's equivalence would not extend it), a difference from the first significant
    point, the unresolved points with what their dev sets detect, the probe against linear by
    its paired intervals."""
    rows = [
        dict(fraction_replaced=0.0, score=0.80, low=0.78, high=0.82, equivalent=None, significant=None,
             difference=0.0, detectable=NAN, versus_linear=0.01, versus_linear_low=0.002, versus_linear_high=0.02),
        dict(fraction_replaced=0.5, score=0.80, low=0.78, high=0.82, equivalent=True, significant=False,
             difference=-0.001, detectable=0.02, versus_linear=0.0, versus_linear_low=-0.01, versus_linear_high=0.01),
        dict(fraction_replaced=0.875, score=0.79, low=0.77, high=0.81, equivalent=False, significant=False,
             difference=-0.01, detectable=0.03, versus_linear=0.0, versus_linear_low=-0.01, versus_linear_high=0.01),
        dict(fraction_replaced=1.0, score=0.75, low=0.73, high=0.77, equivalent=True, significant=True,
             difference=-0.05, detectable=0.025, versus_linear=-0.02, versus_linear_low=-0.03,
             versus_linear_high=-0.01),
    ]
    table = pd.DataFrame([dict(task="sst2", strategy="input_dependence", metric="accuracy", **row) for row in rows])
    path = tmp_path / "curve.csv"
    table.to_csv(path, index=False)
    claims = Curve.read_csv(path).claims()
    assert claims == ("- **sst2** (accuracy): 0.800 [0.780, 0.820] with no head replaced; shown equivalent "
                      "(within ± its margin) up to 0.5 of the heads replaced; significantly different from 1 "
                      "replaced on (Δ -0.050 there); not resolved at 0.875 (detectable there: 0.030 to 0.030); "
                      "the probe above its linear baseline at 1 of 4 points, below at 1 (paired 95% intervals).")


def test_a_table_claims_the_average_against_each_matrix_by_holm():
    def row(name, score, **tests):
        return dict(task="ner", row=name, metric="seqeval_f1", score=score, low=score - 0.01, high=score + 0.01,
                    **{"significant": None, "equivalent": None, "difference": 0.0, "versus_average": NAN,
                       "versus_average_p_adjusted": NAN, **tests})

    table = pd.DataFrame([
        row("original", 0.78),
        row("average", 0.77, significant=True, equivalent=False, difference=-0.01),
        row("identity", 0.55, versus_average=-0.22, versus_average_p_adjusted=0.001),
        row("zeros", 0.79, versus_average=0.02, versus_average_p_adjusted=0.01),
        row("average_init", 0.771, versus_average=0.001, versus_average_p_adjusted=0.9),
        dict(task="mnli", row="original", score=NAN, note="not available"),
    ])
    assert PapaTable(table).claims() == (
        "- **ner** (seqeval_f1): average 0.770 [0.760, 0.780] against original 0.780 [0.770, 0.790], Δ -0.010: "
        "significantly different; the average is significantly above identity Δ -0.220; significantly below "
        "zeros Δ +0.020; not resolved against average_init Δ +0.001.")
