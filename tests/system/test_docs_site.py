"""The docs site builds with ``mkdocs build --strict`` and works offline in headless Chromium.

Needs the ``docs`` extra (``pip install -e ".[docs]"``, part of ``dev``) and Debian's
``chromium``; without them the tests skip locally and fail in CI (``tests.conftest.required``).

The build executes only the quick-start notebook (``ATTNLENS_GALLERY_ONLY``), or reuses its
executed copy in ``build/gallery/`` when attnlens and the notebook are unchanged; mkdocs-jupyter
renders the other notebooks from their executed copies when those are up to date, else from
source (``make docs`` executes all of them). Then:

- the HTML: every page of the navigation (each notebook a page, its executed ``.ipynb`` beside
  it) and every API page exists; a notebook's links to the docs point at the site's pages;
  jaxtyping shapes read as
  written in signatures; no ``<script>``, ``<link>``, ``<img>``, ``<iframe>``, ``<source>`` or
  ``<embed>`` of any page, and no ``url()`` or ``@import`` of the site's own CSS, points outside
  the site (links in text may);
- Chromium, with every host name unresolvable and a NetLog of all requests, opens the gallery
  and the quick-start page: every figure is drawn by plotly.js (an ``svg.main-svg`` in each
  figure's div), the notebook's equations are typeset by the bundled MathJax, the page records
  no error, the console log has no error, and the page requests nothing but ``file://`` URLs
  (Chromium's own background requests, which have no page initiator, aside).
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import required

# every test here needs the `site` fixture: a mkdocs build that executes a notebook
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DOCS_EXTRA = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocstrings": "mkdocstrings",
              "mkdocstrings_handlers.python": "mkdocstrings-python", "nbclient": "nbclient",
              "ipykernel": "ipykernel", "mathjax": "django-static-mathjax", "mkdocs_jupyter": "mkdocs-jupyter"}
EXTERNAL = re.compile(r"^\s*(https?:)?//", re.I)
CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: any network fetch fails
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=30000",
]


def _missing_docs_extra() -> list[str]:
    missing = []
    for module, package in DOCS_EXTRA.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(package)
    return missing


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    missing = _missing_docs_extra()
    if missing:
        required("the docs extra", f"{', '.join(missing)} not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "ATTNLENS_GALLERY_ONLY": "01_quickstart", "NO_MKDOCS_2_WARNING": "1",
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert build.returncode == 0, f"mkdocs build --strict failed:\n{build.stdout[-3000:]}\n{build.stderr[-6000:]}"
    return out


def nav_pages() -> list[str]:
    """Every page (Markdown or notebook) named in mkdocs.yml's navigation."""
    return re.findall(r"^\s*-\s+(?:[^:\n]+:\s+)?([\w/.-]+\.(?:md|ipynb))\s*$",
                      (ROOT / "mkdocs.yml").read_text(), re.M)


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def test_every_page_of_the_navigation_and_every_notebook_is_built(site):
    pages = nav_pages()
    assert "gallery/index.md" in pages and "api/effective.md" in pages
    for page in pages:
        assert (site / re.sub(r"\.(md|ipynb)$", ".html", page)).is_file(), page
    for notebook in sorted((ROOT / "examples").glob("*.ipynb")):
        assert f"gallery/{notebook.stem}.ipynb" in pages, f"{notebook.name} is not in the nav"
        for built in (f"gallery/{notebook.stem}.html", f"gallery/{notebook.stem}.ipynb"):
            assert (site / built).is_file(), built
        page = (site / "gallery" / f"{notebook.stem}.html").read_text(encoding="utf-8")
        assert 'href="../docs/' not in page, f"{notebook.name}: a link to ../docs/ is left on its page"
        links = re.findall(r'href="\.\./([\w-]+)\.html', page)
        assert all((site / f"{link}.html").is_file() for link in links), links
    for module in ("attnlens", "comparison", "papa", "effective", "norm", "stats", "passes", "heads", "probing",
                   "tasks", "lm", "syntax", "ablation", "plots", "report", "files", "loading", "models"):
        assert f"api/{module}.md" in pages, module
    assert (site / "vendor" / "plotly.min.js").stat().st_size > 1_000_000
    assert (site / "vendor" / "mathjax" / "tex-svg.js").stat().st_size > 1_000_000


def test_api_pages_show_jaxtyping_shapes_as_written(site):
    effective = text_of(site / "api" / "effective.html")
    signature = re.search(r"effective_attention\(\s*pattern:.*?\)\s*->\s*[^\n]+", effective, re.S)
    assert signature, "no effective_attention signature on api/effective.html"
    assert 'pattern: Float[Tensor, "batch head query key"]' in signature.group(0)
    assert 'v: Float[Tensor, "batch kv_head key d_head"]' in signature.group(0)
    assert 'Bool[Tensor, "batch key"] | None' in signature.group(0)
    stats = text_of(site / "api" / "stats.html")
    assert re.search(r"""punctuation_table\(tokenizer: Any, device: .*?\)\s*->\s*Bool\[Tensor, ["']vocab["']\]""", stats)
    # the docstrings' reST roles became links or code, never raw roles
    for page in (site / "api").glob("*.html"):
        assert not re.search(r":(func|class|mod|meth|attr|data):`", page.read_text(encoding="utf-8")), page.name
    assert 'href="#attnlens.methods.effective.effective_attention"' in (site / "api" / "effective.html").read_text()


def test_method_pages_carry_their_equations_for_the_bundled_mathjax(site):
    for page, formula in (("papa.html", r"\lambda_h\, A + (1 - \lambda_h)\, C"),
                          ("effective.html", r"A^\perp V = A\,U U^\top V = A V"),
                          ("patterns.html", r"\hat s_R")):
        source = (site / page).read_text(encoding="utf-8")
        assert 'class="arithmatex"' in source, page
        assert formula in html.unescape(source), (page, formula)
        assert 'src="vendor/mathjax/tex-svg.js"' in source, page


class _Resources(HTMLParser):
    """(tag, attribute, value) of every resource a page loads."""

    LOADS = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src",
             "embed": "src", "audio": "src", "video": "src", "object": "data", "track": "src"}

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = self.LOADS.get(tag)
        if name and attrs.get(name):
            self.found.append((tag, name, attrs[name]))
        for extra in ("srcset", "poster"):
            if attrs.get(extra):
                self.found.append((tag, extra, attrs[extra]))


def test_no_page_loads_anything_from_outside_the_site(site):
    checked = 0
    for page in site.rglob("*.html"):
        parser = _Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        outside = [found for found in parser.found if EXTERNAL.match(found[2])]
        assert not outside, f"{page.relative_to(site)} loads {outside}"
        checked += len(parser.found)
    assert checked > 100
    for sheet in list((site / "stylesheets").glob("*.css")) + list((site / "assets").rglob("*.css")):
        text = sheet.read_text(encoding="utf-8")
        urls = re.findall(r"url\(\s*['\"]?([^'\")]+)", text) + re.findall(r"@import\s+['\"]([^'\"]+)", text)
        assert not [url for url in urls if EXTERNAL.match(url)], sheet.name


PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) { __errors.push("error: " + (e.message || e.target.src || e.target.href)); }, true);
window.addEventListener("unhandledrejection", function (e) { __errors.push("unhandled rejection: " + e.reason); });
(function () { var original = console.error; console.error = function () {
  __errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
  return original.apply(console, arguments); }; })();
window.addEventListener("load", function () { setTimeout(function () {
  var figures = Array.prototype.map.call(document.querySelectorAll("div.attnlens-plotly"), function (d) {
    return d.querySelectorAll("svg.main-svg").length; });
  var images = Array.prototype.map.call(document.querySelectorAll("article img"), function (i) {
    return i.naturalWidth; });
  var resources = performance.getEntriesByType("resource").map(function (r) { return r.name; });
  document.body.setAttribute("data-attnlens-figures", JSON.stringify(figures));
  document.body.setAttribute("data-attnlens-images", JSON.stringify(images));
  document.body.setAttribute("data-attnlens-math", String(document.querySelectorAll("mjx-container").length));
  document.body.setAttribute("data-attnlens-resources", JSON.stringify(resources));
  document.body.setAttribute("data-attnlens-errors", JSON.stringify(__errors));
}, 2000); });
</script>"""


def open_in_chromium(page: Path, tmp_path: Path) -> tuple[str, str, list[str]]:
    """DOM, console log and the URLs the page requested (NetLog) of a probed copy of ``page``."""
    if CHROMIUM is None:
        required("headless Chromium", "apt-get install -y chromium (.ci/run does it)")
    probed = page.with_name(f"probed-{page.name}")  # beside it: relative URLs still resolve
    probed.write_text(page.read_text(encoding="utf-8").replace("<head>", "<head>\n" + PROBE, 1), encoding="utf-8")
    netlog = tmp_path / f"{page.stem}.netlog.json"
    run = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
         f"--log-net-log={netlog}", "--dump-dom", probed.as_uri()],
        capture_output=True, text=True, timeout=240,
    )
    return run.stdout, run.stderr, page_requests(netlog)


def attribute(dom: str, name: str) -> object:
    match = re.search(rf'data-attnlens-{name}="([^"]*)"', dom)
    assert match, f"the page did not finish loading (no data-attnlens-{name})"
    return json.loads(html.unescape(match.group(1)))


def console_errors(stderr: str) -> list[str]:
    """Chromium's console messages (``--enable-logging=stderr``) that report an error."""
    return [line for line in stderr.splitlines()
            if "CONSOLE" in line and re.search(r"Uncaught|Error|error", line.split("]", 1)[-1])]


def page_requests(netlog: Path) -> list[str]:
    """URLs of the NetLog's URL requests that a page started (Chromium's own have no initiator)."""
    log = json.loads(netlog.read_text(encoding="utf-8"))
    types = {value: name for name, value in log["constants"]["logEventTypes"].items()}
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if types.get(event.get("type")) == "URL_REQUEST_START_JOB" and params.get("initiator") not in (None, "not an origin"):
            urls.append(params.get("url", ""))
    return urls


def test_gallery_page_offline(site, tmp_path):
    dom, stderr, requests = open_in_chromium(site / "gallery" / "index.html", tmp_path)
    assert attribute(dom, "errors") == []
    assert console_errors(stderr) == []
    assert requests == [], f"the gallery requested {requests}"
    assert all(url.startswith("file://") for url in attribute(dom, "resources"))
    for notebook in sorted((ROOT / "examples").glob("*.ipynb")):
        assert f'href="{notebook.stem}.html"' in dom, f"the gallery does not link {notebook.name}"


def test_quick_start_notebook_page_offline(site, tmp_path):
    dom, stderr, requests = open_in_chromium(site / "gallery" / "01_quickstart.html", tmp_path)
    assert attribute(dom, "errors") == []
    assert console_errors(stderr) == []
    assert requests == [], f"the page requested {requests}"
    assert all(url.startswith("file://") for url in attribute(dom, "resources"))
    figures = attribute(dom, "figures")
    assert len(figures) >= 3 and all(n > 0 for n in figures), f"figures not drawn: {figures}"
    assert int(attribute(dom, "math")) > 0, "MathJax typeset nothing"
    assert 'href="01_quickstart.ipynb"' in dom and "Download the executed notebook" in dom
    executed = json.loads((site / "gallery" / "01_quickstart.ipynb").read_text(encoding="utf-8"))
    outputs = [o for cell in executed["cells"] if cell["cell_type"] == "code" for o in cell["outputs"]]
    assert not [o for o in outputs if o.get("name") == "stderr" or o["output_type"] == "error"], \
        "the quick start printed warnings or errors"
    text = json.dumps(executed)
    assert "plotly.min.js" not in text and "cdn.plot.ly" not in text
    assert len(text) < 1_000_000, "the executed quick start should stay under 1 MB"
