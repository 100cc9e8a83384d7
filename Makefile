# rewardd developer entry points. `make run` and `make test` are the whole quick start.
PYTHON ?= $(shell command -v python3.11 || echo /root/.pyenv/versions/3.11.7/bin/python)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test sandbox-deps bench openapi clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: on these machines the CPU wheel lies on local disk.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

run: install
	$(VENV)/bin/rewardd serve --host $(HOST) --port $(PORT)

test: install sandbox-deps
	$(PY) -m pytest

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

bench: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) tests/benchmarks/bench_math.py --repeat 1
	$(PY) tests/benchmarks/bench_code.py
	$(PY) tests/benchmarks/bench_advantages.py
	$(PY) tests/benchmarks/bench_estimators.py

openapi: install
	$(VENV)/bin/rewardd openapi

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
