# Two commands do all set-up: `make lab` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: lab test install clean-venv

# torch is pinned and installed first, so pip never resolves an unpinned (multi-GB CUDA) torch.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=labs $(if $(filter 0,$(shell id -u)),--allow-root,)

test: $(STAMP)
	$(PY) -m pytest

clean-venv:
	rm -rf $(VENV)
