"""The real data the benchmarks read: ``../shared/data`` beside the repository, or $ATTNLENS_DATA."""

from __future__ import annotations

import os
from pathlib import Path

DATA = Path(
    os.environ.get("ATTNLENS_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def wikitext_paragraphs() -> list[str]:
    """Paragraph lines of WikiText-2 valid (headings `` = Title = `` and blank lines dropped)."""
    path = DATA / "wikitext2" / "valid.txt"
    if not path.exists():
        raise SystemExit(f"real data not found at {path} (../shared/data beside the repository)")
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("=")]
