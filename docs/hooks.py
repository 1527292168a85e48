"""MkDocs hooks of the attnlens docs (``hooks:`` in ``mkdocs.yml``).

- The gallery: the notebooks of ``examples/`` are executed when their copy is stale
  (``docs/gallery.py``). Each is added to the site as ``gallery/NAME.ipynb``, which the
  ``mkdocs-jupyter`` plugin renders as a page; nothing is written into ``docs/``. A notebook
  links the docs as ``../docs/X.md``, right in the repository; on its page the link becomes
  ``../X.html``.
- Vendored scripts, copied from installed packages into the site so that it makes no request
  outside itself: ``vendor/plotly.min.js`` (the ``plotly`` package, loaded by
  ``javascripts/figures.js`` on pages with figures) and ``vendor/mathjax/tex-svg.js`` (MathJax 3
  from the ``django-static-mathjax`` package; one file, its SVG output needs no web fonts).
"""

from __future__ import annotations

import importlib.util
import logging
import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.attnlens")
HERE = Path(__file__).resolve().parent
DOCS_LINK = re.compile(r'href="\.\./docs/([\w/-]+)\.md(#[^"]*)?"')


def _gallery():
    spec = importlib.util.spec_from_file_location("attnlens_docs_gallery", HERE / "gallery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vendored() -> dict[str, Path]:
    """Site path -> installed file of every vendored script; a clear error when one is missing."""
    found = {}
    for site_path, package, inside, install in (
        ("vendor/plotly.min.js", "plotly", "package_data/plotly.min.js", "plotly"),
        ("vendor/mathjax/tex-svg.js", "mathjax", "static/mathjax/es5/tex-svg.js", "django-static-mathjax"),
    ):
        spec = importlib.util.find_spec(package)
        path = Path(spec.origin).parent / inside if spec and spec.origin else None
        if path is None or not path.is_file():
            raise PluginError(
                f"{site_path} comes from the {install!r} package, which is not installed: "
                'pip install -e ".[docs]" (make docs does it).'
            )
        found[site_path] = path
    return found


@event_priority(100)  # before mkdocs-jupyter's on_files, which makes the notebooks pages
def on_files(files: Files, config) -> Files:
    for site_path, source in vendored().items():
        files.append(File.generated(config, site_path, abs_src_path=str(source)))
    try:
        shown = _gallery().ensure_executed(log=log.info)
    except (RuntimeError, ValueError) as error:
        raise PluginError(f"gallery: {error}") from None
    for name, path in shown.items():
        files.append(File.generated(config, f"gallery/{name}.ipynb", abs_src_path=str(path)))
    return files


def on_nav(nav, config, files):
    """mkdocs-jupyter (0.26.3) wraps each notebook's File in its own, which recomputes
    ``abs_src_path`` from ``src_dir``: a generated file has none, so its page would read
    nothing. The wrapper takes the wrapped file's path."""
    for file in files:
        inner = getattr(file, "file", None)
        if inner is not None and file.abs_src_path is None:
            file.abs_src_path = inner.abs_src_path
    return nav


def on_page_content(html: str, page, config, files) -> str:
    if page.file.src_uri.startswith("gallery/") and page.file.src_uri.endswith(".ipynb"):
        return DOCS_LINK.sub(lambda m: f'href="../{m.group(1)}.html{m.group(2) or ""}"', html)
    return html
