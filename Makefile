# The two commands a newcomer runs (see README.md). Each creates/refreshes .venv with what it needs.
.PHONY: run test test-fast lint bench gpu-check install install-dev stack-up stack-down deploy docs docs-build

install:
	bash scripts/install.sh

install-dev:
	bash scripts/install.sh dev

run: install
	.venv/bin/sweepflow run

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check ddp_runtime
	.venv/bin/lint-imports  # the layering contracts: [tool.importlinter] in pyproject.toml

test: install-dev lint
	bash scripts/install-browser.sh
	bash scripts/install-postgres.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -n 2 --dist loadscope --no-loadscope-reorder --max-worker-restart=0 --durations=40

# The development lane: every test that starts no server and no cluster (markers: see pyproject.toml), in a
# few minutes on 2 cores. Needs the dev venv (`make install-dev`). `make test` stays the whole suite.
FAST_LANE = not (dask or mlflow_server or prefect or s3 or stack or browser or postgres)
test-fast:
	.venv/bin/python -m pytest -q -p no:cacheprovider -m "$(FAST_LANE)"

bench: install
	.venv/bin/python benchmarks/bench_ddp_runtime.py

# The GPU check (benchmarks/gpu_check.py, never yet run on a GPU): on a host with NVIDIA GPUs, the GPU paths
# (the tutorial with use_gpu, NCCL DDP, FSDP + a distributed checkpoint, bf16, the pipeline), about a minute each,
# and a table of them; exits 1 if one fails, 2 on a host without an NVIDIA GPU.
gpu-check: install
	.venv/bin/python benchmarks/gpu_check.py

# The full local stack (docs/deploying.md), and the deployments on it.
stack-up:
	infra/stack up

stack-down:
	infra/stack down

deploy:
	set -a && . $${SWEEPFLOW_HOME:-$$HOME/.sweepflow}/stack/stack.env && set +a && .venv/bin/prefect --no-prompt deploy --all

# The documentation site (mkdocs.yml, docs/; the docs extra, in the dev venv): served while you edit, or built strict
# into site/ (tests/docs/test_docs.py builds it too). `make docs DOCS_ADDR=127.0.0.1:8123` serves on another address.
DOCS_ADDR ?= 127.0.0.1:8000
docs:
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs serve --dev-addr $(DOCS_ADDR)

docs-build:
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site
