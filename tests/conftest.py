"""Shared fixtures: the embedded MiniLM (loaded once) and real sentences from ../shared/data."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: real datasets: ../shared/data beside the repository, or $ATTNLENS_DATA
DATA = Path(
    os.environ.get("ATTNLENS_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


@pytest.fixture(scope="session")
def sst2_sentences() -> list[str]:
    path = DATA / "sst2" / "dev.tsv"
    if not path.exists():
        pytest.skip(f"real data not found at {path} (../shared/data beside the repo)")
    return [row["sentence"] for row in read_tsv(path)]


@pytest.fixture(scope="session")
def mrpc_pairs() -> list[tuple[str, str]]:
    path = DATA / "mrpc" / "dev.tsv"
    if not path.exists():
        pytest.skip(f"real data not found at {path}")
    return [(row["#1 String"], row["#2 String"]) for row in read_tsv(path)]


@pytest.fixture(scope="session")
def minilm():
    import attnlens

    return attnlens.load()


@pytest.fixture(scope="module")
def single_blas_thread():
    """NumPy reference loops do many tiny SVDs and products: one BLAS thread is fastest."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield
