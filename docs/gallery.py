"""The gallery's notebooks, executed before mkdocs-jupyter renders them.

The plugin ``mkdocs-jupyter`` (``mkdocs.yml``) turns each notebook of ``examples/`` into a page
of the site. This file executes the notebooks first. The plugin's ``execute: true`` is not used,
for three reasons, each measured on 2026-11-28 with mkdocs-jupyter 0.26.3 and nbconvert 7.17:

1. **Stale outputs or slow builds.** The plugin's cache key is the notebook file and its own
   settings. A change to attnlens alone would keep every executed page as it was. Without the
   cache, every build executes all six notebooks: 397 s on 2 shared cores, 153 s of it CPU time
   (18, 27, 45, 181, 47 and 75 s). Here an executed copy (``build/gallery/NAME.ipynb``, or
   ``$ATTNLENS_GALLERY_CACHE``) is keyed by the notebook's cells, attnlens' sources and
   ``docs/papa_curve.csv``. A build in which none of these changed executes nothing: the whole
   ``mkdocs build`` then takes 25 s.
2. **Figures.** nbconvert's HTML drops plotly's ``application/vnd.plotly.v1+json`` output ("is
   not able to be represented"), so the pages had no figures. plotly's HTML renderers embed
   plotly.js in each notebook (4.8 MB) or load it and MathJax from a CDN, and the site is
   offline. So each figure output of the executed copy also gets a ``text/html`` placeholder,
   a ``div`` and the figure's JSON. ``docs/javascripts/figures.js`` draws it with the site's own
   plotly.js. JupyterLab still shows the plotly output of the downloaded notebook.
3. **The kernel's environment.** The kernel runs offline, on one thread, with plotly's figures
   as JSON (``PLOTLY_RENDERER=plotly_mimetype``: no plotly.js in the notebook), whoever calls
   ``mkdocs build``.

``docs/hooks.py`` calls :func:`ensure_executed` when the site is built. ``python docs/gallery.py
[--only NAME ...] [--force]`` does the same by hand. ``$ATTNLENS_GALLERY_ONLY`` (names,
comma-separated) executes only those notebooks, for quick test builds. The site then shows the
others from their up-to-date executed copies, or as their source without outputs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
#: what an executed copy depends on besides the notebook itself
SOURCES = ("attnlens/**/*.py", "docs/papa_curve.csv")
#: the kernel's environment while executing (offline, one thread, plotly JSON only, quiet)
KERNEL_ENV = {
    "PLOTLY_RENDERER": "plotly_mimetype",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "OMP_NUM_THREADS": "1",
    # transformers imports tqdm.auto, which warns in a kernel without ipywidgets; not the reader's concern
    "PYTHONWARNINGS": "ignore:IProgress not found",
}
TIMEOUT = 600  # seconds per cell
VERSION = "2"  # of the execution settings above: bump to execute every notebook again
PLOTLY = "application/vnd.plotly.v1+json"


def cache_dir() -> Path:
    return Path(os.environ.get("ATTNLENS_GALLERY_CACHE", ROOT / "build" / "gallery"))


def notebooks() -> list[Path]:
    return sorted(EXAMPLES.glob("*.ipynb"))


def selected(only: Iterable[str] | None = None) -> list[str]:
    """The notebooks to execute: all, or ``only`` (else ``$ATTNLENS_GALLERY_ONLY``) when given."""
    if only is None and os.environ.get("ATTNLENS_GALLERY_ONLY"):
        only = [name.strip() for name in os.environ["ATTNLENS_GALLERY_ONLY"].split(",") if name.strip()]
    names = [path.stem for path in notebooks()]
    if only is None:
        return names
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ValueError(f"No notebook {unknown} in examples/; there are {names}.")
    return [name for name in names if name in set(only)]


def source_key(path: Path) -> str:
    """Hash of the notebook's cells, the files of :data:`SOURCES` and :data:`VERSION`."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    digest = hashlib.sha256(f"attnlens-gallery-{VERSION}-{sorted(KERNEL_ENV.items())}".encode())
    for cell in notebook["cells"]:
        digest.update(f"\0{cell['cell_type']}\0{''.join(cell['source'])}".encode())
    for pattern in SOURCES:
        for source in sorted(ROOT.glob(pattern)):
            digest.update(f"\0{source.relative_to(ROOT)}\0".encode() + source.read_bytes())
    return digest.hexdigest()


def executed(path: Path) -> Path | None:
    """The executed copy of ``path`` when it is up to date, else None."""
    copy = cache_dir() / path.name
    try:
        meta = json.loads(copy.read_text(encoding="utf-8"))["metadata"].get("attnlens_gallery", {})
    except (OSError, ValueError, KeyError):  # missing or damaged: executed again
        return None
    return copy if meta.get("key") == source_key(path) else None


def add_figure_html(notebook: Any, name: str) -> None:
    """Give each plotly output a ``text/html`` placeholder that ``javascripts/figures.js`` draws."""
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])
               if PLOTLY in output.get("data", {})]
    for index, output in enumerate(outputs):
        figure = output["data"][PLOTLY]
        height = int((figure.get("layout") or {}).get("height") or 450)
        div = f"{name}-figure-{index}"
        data = json.dumps(figure, separators=(",", ":")).replace("</", "<\\/")
        output["data"]["text/html"] = (
            f'<div class="attnlens-plotly" id="{div}" style="height:{height}px"></div>\n'
            f'<script type="application/json" id="{div}-data">{data}</script>')


def execute(path: Path) -> Path:
    """Execute ``path`` in a fresh kernel (working folder ``examples/``) and write its executed
    copy. A cell that raises stops it with one error naming the notebook and the cell."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    from attnlens.core.files import write_atomic

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=TIMEOUT, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    started = time.perf_counter()
    try:
        pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        client.execute(env={**os.environ, **KERNEL_ENV, "PYTHONPATH": pythonpath})  # this checkout's attnlens
    except CellExecutionError as error:
        raise RuntimeError(f"examples/{path.name} failed while executing:\n{error}") from None
    add_figure_html(notebook, path.stem)
    notebook.metadata["attnlens_gallery"] = {
        "key": source_key(path), "seconds": round(time.perf_counter() - started, 1),
    }
    copy = cache_dir() / path.name
    write_atomic(copy, (nbformat.writes(notebook) + "\n").encode("utf-8"))
    return copy


def ensure_executed(only: Sequence[str] | None = None, *, force: bool = False,
                    log: Any = print) -> dict[str, Path]:
    """Execute every selected notebook whose copy is stale (all of them with ``force``).
    Returns, for every notebook, the file the site shows: its up-to-date executed copy, or the
    notebook itself when it was not selected and has none."""
    names = selected(only)
    shown = {}
    for path in notebooks():
        copy = None if force and path.stem in names else executed(path)
        if copy is None and path.stem in names:
            log(f"gallery: executing examples/{path.name} ...")
            started = time.perf_counter()
            copy = execute(path)
            log(f"gallery: examples/{path.name} executed in {time.perf_counter() - started:.1f} s")
        shown[path.stem] = copy or path
    return shown


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="execute only these notebooks")
    parser.add_argument("--force", action="store_true", help="execute even up-to-date copies")
    args = parser.parse_args(argv)
    try:
        ensure_executed(args.only, force=args.force)
    except (RuntimeError, ValueError) as error:
        sys.exit(f"gallery: {error}")


if __name__ == "__main__":
    main()
