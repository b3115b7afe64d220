# The two commands a newcomer runs (see README.md). Each creates/refreshes .venv with what it needs.
.PHONY: run test lint bench install install-dev stack-up stack-down deploy

install:
	bash scripts/install.sh

install-dev:
	bash scripts/install.sh dev

run: install
	.venv/bin/sweepflow run

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check ddp_runtime

test: install-dev lint
	.venv/bin/python -m pytest -q -p no:cacheprovider

bench: install
	.venv/bin/python benchmarks/bench_ddp_runtime.py

# The full local stack (see README "Run it on your cluster"), and the deployments on it.
stack-up:
	infra/stack up

stack-down:
	infra/stack down

deploy:
	set -a && . $${SWEEPFLOW_HOME:-$$HOME/.sweepflow}/stack/stack.env && set +a && .venv/bin/prefect --no-prompt deploy --all
