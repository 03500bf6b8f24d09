# tpumon: two commands on a fresh Debian/Ubuntu machine with Python >= 3.10.
#   make demo   the agent on its built-in TPU simulator, with a leaking workload
#   make test   the quality gates (ruff, mypy), then the whole test suite (installs what it needs)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
DEMO_ADDRESS ?= :9847
DEMO_PORT = $(lastword $(subst :, ,$(DEMO_ADDRESS)))
# tpumon status and watch ask 127.0.0.1:9847 unless told: on another port, the banner says so
DEMO_AGENT = $(if $(filter 9847,$(DEMO_PORT)),, --agent http://127.0.0.1:$(DEMO_PORT))
DEMO_SCENARIO ?= fast-leak
DEMO_HOSTS ?= 4
DEMO_POD_SCENARIO ?= slice-leak

# Python writes each module's bytecode once, as it does by default: an environment's
# PYTHONDONTWRITEBYTECODE would have each of the hundreds of processes the tests start
# compile tpumon again, and pytest rewrite every test module's asserts again in each run.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help demo demo-pod test test-fast test-explore lint test-frameworks bench venv system-deps-demo \
	system-deps-test system-deps-bench system-deps-pod clean protos

help:
	@echo "make demo    run the agent on the TPU simulator (metrics on $(DEMO_ADDRESS))"
	@echo "make demo-pod   a simulated 4-host slice, 4 agents and Prometheus (docs/pods.md)"
	@echo "make test    install test dependencies, run ruff and mypy, then the whole suite"
	@echo "make test-fast   ruff, mypy and the unit tests (no end-to-end or slow tests; < 1 min)"
	@echo "make test-explore   the property tests on fresh random examples (ROUNDS=5 runs)"
	@echo "make lint    ruff and mypy only (settings in pyproject.toml)"
	@echo "make test-frameworks   the reporters against real PyTorch/XLA and JAX (CPU)"
	@echo "make bench   run the benchmarks (figures go to docs/benchmarks.md)"
	@echo "make clean   remove the virtual environment and caches"
	@echo "make protos  regenerate tpumon/podresources/api_pb2.py{,i} from api.proto"

system-deps-demo:
	@scripts/ensure-system-deps demo

system-deps-test:
	@scripts/ensure-system-deps test

system-deps-bench:
	@scripts/ensure-system-deps bench

$(STAMP): pyproject.toml
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

venv: system-deps-demo $(STAMP)

demo: venv
	@echo
	@echo "  tpumon demo: a simulated TPU v4 VM (4 chips) running scenario '$(DEMO_SCENARIO)',"
	@echo "  time accelerated 60x (times shown are simulated). The leak is called within two"
	@echo "  minutes (under two simulated hours); the job runs out of HBM after about six:"
	@echo "  watch '.venv/bin/tpumon status$(DEMO_AGENT)'. Metrics: http://localhost:$(DEMO_PORT)/metrics"
	@echo "  Try 'make demo DEMO_SCENARIO=healthy'; 'tpumon sim --list' lists scenarios. Ctrl-C stops."
	@echo
	@# the agent refuses a state directory others may write (docs/security.md); one made by
	@# an earlier demo under a umask of 002 is group-writable
	@if [ -d .demo-state ]; then chmod go-w .demo-state; fi
	$(BIN)/tpumon agent --simulate --scenario $(DEMO_SCENARIO) --listen-address $(DEMO_ADDRESS) \
		--poll-interval 0.25 --state-dir .demo-state --reporter-socket .demo-state/reporter.sock

system-deps-pod:
	@scripts/ensure-system-deps pod

# A simulated v4-32 slice: 4 hosts on 127.0.0.1-4, an agent each, Prometheus on :9090
demo-pod: system-deps-pod venv
	$(BIN)/python scripts/demo-pod --hosts $(DEMO_HOSTS) --scenario $(DEMO_POD_SCENARIO)

lint: $(STAMP)
	$(BIN)/ruff check tpumon tests bench
	$(BIN)/mypy

# The whole suite: the unit tests on every core (pytest-xdist), then the end-to-end ones
# two at a time (their timings are real: agents, simulators, Prometheus; they wait far more
# than they compute, two of them ~0.9 of a core on the 2-core dev VM).
test: system-deps-test lint
	$(BIN)/python -m pytest -q -m "not e2e" -n auto --durations=5
	$(BIN)/python -m pytest -q -m e2e -n 2 --durations=15

# The unit tests for the inner loop: everything not marked e2e or slow (pyproject.toml).
test-fast: system-deps-test lint
	$(BIN)/python -m pytest -q -m "not e2e and not slow" -n auto --durations=5

# The property tests (Hypothesis) on fresh random examples, ROUNDS times: `make test` draws
# the same examples every run (tests/conftest.py), so new counterexamples are looked for here.
ROUNDS ?= 5
test-explore: system-deps-test venv
	for round in $$(seq $(ROUNDS)); do \
		TPUMON_HYPOTHESIS=explore $(BIN)/python -m pytest -q -m hypothesis -n auto -p no:cacheprovider || exit 1; \
	done

# Real PyTorch/XLA and JAX on CPU against the agent (a separate ~7 GiB venv).
test-frameworks:
	scripts/frameworks-venv
	RUN_FRAMEWORK_TESTS=1 .venv-frameworks/bin/python -m pytest -q --durations=5 tests/frameworks

bench: system-deps-bench venv
	$(BIN)/python bench/run.py
	$(BIN)/python bench/detect.py
	$(BIN)/python bench/false_alarms.py
	$(BIN)/python bench/nuisances.py
	$(BIN)/python bench/line_to_oom.py
	$(BIN)/python bench/forecast_band.py
	$(BIN)/python bench/analyze_speed.py
	$(BIN)/python bench/report_speed.py
	$(BIN)/python bench/store.py
	$(BIN)/python bench/reporters.py
	$(BIN)/python bench/hostile.py
	$(BIN)/python bench/mention_spam.py
	$(BIN)/python bench/slice_fanout.py
	$(BIN)/python bench/prometheus_pod.py
	@if [ -x .venv-frameworks/bin/python ]; then .venv-frameworks/bin/python bench/reporters.py \
	&& .venv-frameworks/bin/python bench/snapshot.py; \
	else echo "(make test-frameworks first for the PyTorch/XLA and JAX loop overhead and snapshots)"; fi
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/overhead_parts.py
	$(BIN)/python bench/page_touch.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/http_serve.py

clean:
	rm -rf $(VENV) .venv-frameworks .pytest_cache build *.egg-info .demo-state .demo-pod
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# The kubelet pod-resources subset's Python modules, committed. grpcio-tools 1.62 (protoc
# 25, gencode for protobuf 4.25) in a throwaway venv: newer protoc output refuses to load
# under an older protobuf runtime, and pyproject.toml allows protobuf >= 4.25. Only the
# messages are generated: tpumon calls the two methods by name (no _grpc module).
PROTOC_VENV := .venv-protoc
protos:
	$(PYTHON) -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'grpcio-tools==1.62.3'
	$(PROTOC_VENV)/bin/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
		tpumon/podresources/api.proto
