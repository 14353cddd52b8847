# The two set-up commands are `make repro` and `make test`; both install what they need first.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export WANDB_MODE ?= offline
export WANDB_SILENT := true
export PYTHONDONTWRITEBYTECODE := 1
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
PYTEST_ARGS ?=

.PHONY: install repro test ui wandb-sync bench contract

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	touch $(STAMP)

install: $(STAMP)

## Run every registered paper's pipeline at the default profile (DVC skips what is cached).
repro: $(STAMP)
	test -d .dvc || $(BIN)/dvc init -q
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/dvc repro
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m stages readme

## The whole test suite (what CI runs).
test: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest $(PYTEST_ARGS)

## Prefect server + scheduled deployments for every paper; prints the UI address.
ui: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m flows.serve --with-server

## Upload the offline W&B runs under wandb/ (needs `wandb login`).
wandb-sync: $(STAMP)
	$(BIN)/wandb sync --sync-all wandb/

bench: $(STAMP)
	$(BIN)/python -m kernels.bench

contract:
	$(PY) ../shared/tools/check_contract.py
