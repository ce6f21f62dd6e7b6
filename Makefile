# koord-queue-py: a Koord-Queue compatible job queue for Kubernetes (webhook + reconciler).
# `make run` and `make test` do all the set-up on a fresh machine: virtual environment,
# control-plane binaries (built from Go modules into ~/.cache/koord-queue-py), then the work.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST := $(PY) -m pytest
SOURCES := shared webhook reconciler certs koord_queue/__init__.py koord_queue/cli koord_queue/dashboard testenv chaos hack/dist.py plugins/krew/launcher.py

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The dependencies come from the lock (exact versions, every file checked against its hash: pip
# itself included), then the project without dependencies; docs/development.md#locked-dependencies.
$(STAMP): pyproject.toml requirements/dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(PY) -m pip check
	@touch $(STAMP)

.PHONY: venv
venv: $(STAMP) ## Create the virtual environment and install the package (when missing)

LOCK := CUSTOM_COMPILE_COMMAND="make lock" $(VENV)/bin/pip-compile --quiet --generate-hashes --strip-extras \
	--no-emit-find-links --no-emit-index-url --no-allow-unsafe --unsafe-package koord-queue-py $(if $(UPGRADE),--upgrade,)

.PHONY: lock
lock: venv ## Regenerate the locked dependencies requirements/{dev,server,bench}.txt (with hashes) from pyproject.toml; UPGRADE=1 takes the newest allowed
	$(LOCK) --extra server --extra dev -o requirements/dev.txt pyproject.toml
	$(LOCK) -c requirements/dev.txt --extra server --build-deps-for wheel -o requirements/server.txt pyproject.toml
	$(LOCK) -c requirements/dev.txt --extra server --extra dev --extra bench -o requirements/bench.txt pyproject.toml

.PHONY: testenv
testenv: venv ## Build the control-plane binaries (etcd, kube-apiserver, controller-manager, scheduler, kwok)
	$(PY) -m testenv.binaries

.PHONY: run
run: venv testenv ## Run the whole system on a local control plane; prints READY kubeconfig=.local/kubeconfig
	$(PY) -m testenv.main

.PHONY: demo
demo: venv ## Live queue-level preemption story against `KWOK_NODES=0 make run` (in another terminal)
	$(PY) -m testenv.demo

.PHONY: lint
lint: venv ## ruff, mypy --strict and the import rules (import-linter)
	$(VENV)/bin/ruff check $(SOURCES) tests bench
	$(VENV)/bin/ruff format --check $(SOURCES) tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy hack/dist.py plugins/krew/launcher.py
	$(VENV)/bin/lint-imports

.PHONY: format
format: venv ## Format the code with ruff
	$(VENV)/bin/ruff format $(SOURCES) tests bench
	$(VENV)/bin/ruff check --fix $(SOURCES) tests bench

.PHONY: unit
unit: venv ## Unit tests of the pure core (no cluster)
	$(PYTEST) tests/unit

.PHONY: integration
integration: venv testenv ## Integration tests against a real etcd + kube-apiserver
	$(PYTEST) tests/integration

.PHONY: e2e
e2e: venv testenv ## End-to-end tests: + controller-manager, scheduler and kwok fake nodes, headless Chromium (installed with apt-get when missing); webhook and reconciler confined as the image runs them (needs root)
	$(PY) -m testenv.browser
	$(PYTEST) tests/e2e

.PHONY: test
test: lint unit integration e2e ## Everything CI runs: lint, unit, integration, e2e

.PHONY: bench
bench: venv testenv ## Benchmarks (core, webhook, end-to-end admission, Kueue as baseline); results in bench/results/, BENCHMARKS.md
	$(PY) -m pip install --quiet --require-hashes -r requirements/bench.txt
	$(PY) bench/bench_core.py
	$(PY) bench/bench_webhook.py
	$(PY) bench/bench_admission.py
	$(PY) bench/bench_kueue.py
	$(PY) bench/bench_kueue.py --jobs 5000 --quotas 10 --saturate 10 --kueue-qps 200 --kueue-burst 400 --order ours,kueue
	$(PY) bench/bench_kueue.py --jobs 1000 --quotas 10 --mode full --order ours,kueue
	$(PY) bench/plot.py

.PHONY: bench-soak
bench-soak: venv testenv ## Churn soak: Jobs created, finished, deleted at a steady rate (MINUTES=36 RATE=24: over 50,000 jobs); bench/results/soak-*.json
	$(PY) bench/bench_soak.py --minutes $(or $(MINUTES),36) --rate $(or $(RATE),24)

.PHONY: chaos
chaos: venv testenv ## Fault injection under load with an independent invariant observer (QUICK=1 for a short run); see RELIABILITY.md
	$(PY) -m chaos.run $(if $(QUICK),--quick,)

IMAGE ?= koord-queue-py:0.2.0

.PHONY: image
image: ## Build the container image (needs a Docker daemon): IMAGE=registry/name:tag
	docker build -t $(IMAGE) .

.PHONY: manifests
manifests: ## Render the install manifests (kubectl kustomize manifests/)
	kubectl kustomize manifests/

.PHONY: chart
chart: venv ## Generate the job-kind lists of manifests/ from the adapter registry, then the Helm chart charts/koord-queue from manifests/ (CHECK=1: only check both are up to date)
	$(PY) -m testenv.chart $(if $(CHECK),--check,)

.PHONY: helm
helm: venv ## Build helm (pinned in hack/helmbin) into the binary cache and print where it is
	$(PY) -c 'from testenv import binaries; print(binaries.helm())'

.PHONY: dist
dist: venv ## Release artifacts of HEAD in dist/: sdist, wheel, Helm chart, install manifest, krew archive + manifest (KREW_URL=where the archive is published)
	$(PY) -m hack.dist $(if $(KREW_URL),--base-url $(KREW_URL),)

.PHONY: clean
clean: ## Remove local state (.local/, caches); keeps the venv and the binary cache
	rm -rf .local .pytest_cache .mypy_cache .ruff_cache .hypothesis
