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
## two xdist workers (every test is single-threaded; CI has 2 cores); PYTEST_ARGS= runs serially
PYTEST_ARGS ?= -n 2 --dist loadgroup

.PHONY: install system-deps repro test ui wandb-sync bench contract plots mutants verdicts replicate

## System packages the stages need (chromium for vision2web's verifier, git): installed with apt when
## root, otherwise one line naming them. `make repro` requires them; `make test` only warns (tests skip).
system-deps:
	$(PY) -m stages.common.system_deps install

## The pinned packages go in with uv (cold caches here: ~62 s with byte-compilation against pip's ~125 s),
## byte-compiled as pip does (PYTHONDONTWRITEBYTECODE is set, so uncompiled modules would be recompiled at every
## import). uv does not read pip's config: pip's find-links (PIP_FIND_LINKS and pip.conf's global.find-links, where
## these machines keep the CPU build of torch 2.13.0) are passed on, and the torch build installed is printed.
## If installing uv or the set with it fails, pip installs the set, as before.
UV_VERSION ?= 0.13.9
$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	{ $(BIN)/python -m pip install -q uv==$(UV_VERSION) \
	  && links="$${PIP_FIND_LINKS:-} $$($(BIN)/python -m pip config get global.find-links 2>/dev/null || true)" \
	  && $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python \
	       $$(for l in $$(printf '%s\n' $$links | sort -u); do printf -- '--find-links %s ' $$l; done) \
	       -r requirements.lock; } \
	  || { echo "uv (or installing uv) failed: installing requirements.lock with pip"; \
	       $(BIN)/python -m pip install -q --upgrade pip && $(BIN)/python -m pip install -q -r requirements.lock; }
	$(BIN)/python -c "import torch; print('installed torch', torch.__version__)"
	touch $(STAMP)

install: $(STAMP)

## Run every registered paper's pipeline at the default profile (DVC skips what is cached), REPRO_JOBS
## papers at a time (flows/parallel_repro.py: one `dvc --wait-for-lock repro report@<slug>` per paper,
## then `dvc repro --keep-going` for the summary; REPRO_JOBS=1 is that alone). One paper's failure does
## not stop the others; the run ends listing the papers that failed and why, then logs every paper's
## committed report to W&B once (offline by default). `tee -i`: Ctrl-C reaches the driver, which stops
## the running stages, while the log keeps its last lines.
REPRO_JOBS ?= 2
repro: $(STAMP)
	$(PY) -m stages.common.system_deps install --required
	test -d .dvc || $(BIN)/dvc init -q
	@mkdir -p .dvc/tmp
	@# without a DVC remote, DVC's closing "Use `dvc push` ..." hint is noise: drop it
	@set -o pipefail; export PATH=$(abspath $(BIN)):$$PATH; \
	$(BIN)/python -m flows.parallel_repro --jobs $(REPRO_JOBS) 2>&1 | tee -i .dvc/tmp/repro.log; status=$$?; \
	$(BIN)/python -m stages repro-failures .dvc/tmp/repro.log; \
	$(BIN)/python -m stages readme || status=1; \
	$(BIN)/python -m stages claims || status=1; \
	$(BIN)/python -m stages wandb-log || status=1; \
	exit $$status

## Every paper's plots as one offline HTML page (dvc_plots/index.html; DVC's own needs a CDN).
plots: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m stages plots

## Mutation testing of the core method modules (slow; not part of CI): kill rate per module.
mutants: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m tests.mutation

## The whole test suite (what CI runs).
test: $(STAMP)
	$(PY) -m stages.common.system_deps install
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m pytest $(PYTEST_ARGS)

## Prefect server + scheduled deployments for every paper; prints the UI address.
ui: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m flows.serve --with-server

## Upload the offline W&B runs under wandb/ (needs `wandb login`).
wandb-sync: $(STAMP)
	@ls -d wandb/offline-run-* >/dev/null 2>&1 || { echo "no offline W&B runs under wandb/ (run make repro first)"; exit 0; }
	$(BIN)/wandb sync --yes wandb/offline-run-*

## Kernel table (torch reference vs naive baseline on CPU; Triton vs torch + roofline on CUDA), the STAR-KV decode
## row at the paper's shapes (Hq 32, Hkv 8, T 32768; on CPU batch 1, the torch paths), then S solo runs vs one seed ensemble.
bench: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m kernels.bench
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m benchmarks.decode_speed
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m benchmarks.ensemble

contract:
	$(PY) ../shared/tools/check_contract.py

## This checkout's reports/*/claims.json against the committed ones (AGAINST=<git revision>, default HEAD):
## verdicts reproduced, those that moved, identical per-seed values, the machine (flows/verdicts.py).
AGAINST ?= HEAD
verdicts: $(STAMP)
	$(BIN)/python -m flows.verdicts --against $(AGAINST)

## Every paper re-run as a study on fresh seeds (flows/replicate.py; ~75 min on 2 cores, the committed results stay):
## which committed verdicts a new draw of the seeds keeps, written to reports/studies/replication.md.
## PAPERS="sciql plantain" for some; `make replicate TABLE=1` only rewrites the table from the study folders.
replicate: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m flows.replicate $(if $(TABLE),--table) $(if $(PAPERS),--papers $(PAPERS))

# --- Scaling out (flows/remote.py, flows/pools.py; README "Scaling out") ---
.PHONY: remote pool worker
POOL ?= papers
QUEUE ?=

## Shared DVC remote: make remote REMOTE=/mnt/shared/dvc-store (or s3://bucket/path, ssh://host/path).
## Writes .dvc/config (commit it: every worker's checkout then pulls/pushes there).
remote: $(STAMP)
	@test -n "$(REMOTE)" || { echo "error: usage: make remote REMOTE=<folder-or-url>" >&2; exit 2; }
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m flows.remote set "$(REMOTE)"

## Work pool + crash detection + the git-sourced `paper` deployment: make pool REPO=<git-url> (needs PREFECT_API_URL).
pool: $(STAMP)
	@test -n "$(REPO)" || { echo "error: usage: make pool REPO=<git-url> [POOL=papers]" >&2; exit 2; }
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m flows.pools setup --repo "$(REPO)" --pool $(POOL)

## One process worker on this machine: make worker [POOL=papers] [QUEUE=<queue>]
worker: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/prefect worker start --pool $(POOL) --type process $(if $(QUEUE),--work-queue $(QUEUE))

# --- Profiling (benchmarks/profile.py) ---
.PHONY: profile
STAGE ?= train
PROFILE ?= smoke

## py-spy over one stage: make profile SLUG=<slug> [STAGE=train] [PROFILE=smoke] -> reports/profiles/<slug>-<stage>.{txt,svg}
profile: $(STAMP)
	@test -n "$(SLUG)" || { echo "error: usage: make profile SLUG=<slug> [STAGE=train] [PROFILE=smoke]" >&2; exit 2; }
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m benchmarks.profile $(SLUG) --stage $(STAGE) --profile $(PROFILE)
