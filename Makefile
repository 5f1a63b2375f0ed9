# Learning Attention: build the book, run the tests, open the notebooks.
# Every target is phony: book/ and notebooks/ are folders, and make must never call them up to date.
.PHONY: book test unit nbval book-strict lab notebooks bench venv clean

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat requirements.txt pyproject.toml | cksum | cut -d' ' -f1)
export PYTHONHASHSEED := 0
export MPLBACKEND := Agg

venv: $(STAMP)

# The environment: exact pins from requirements.txt, then attn_np itself (editable, so notebooks
# import the working tree's code without touching sys.path).
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*
	touch $@

book: venv
	$(BIN)/jupyter-book build --all . 
	@echo
	@echo "The book is built. Open: file://$(CURDIR)/_build/html/index.html"

test: venv unit nbval book-strict
	@echo "make test: unit tests, nbval on every notebook and the strict book build all passed."

unit: venv
	$(BIN)/python -m pytest -q tests

nbval: venv
	$(BIN)/python -m pytest -q -p no:randomly --nbval --nbval-current-env notebooks

book-strict: venv
	$(BIN)/jupyter-book build --all --warningiserror --keep-going .

lab: venv
	$(BIN)/jupyter lab notebooks

notebooks: venv
	$(BIN)/python scripts/execute_notebooks.py notebooks/*.ipynb

bench: venv
	$(BIN)/python -m attn_np.bench all

clean:
	rm -rf _build .pytest_cache .hypothesis
