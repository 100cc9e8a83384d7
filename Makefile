# rewardd developer entry points. `make run` and `make test` are the whole quick start.
PYTHON ?= $(shell command -v python3.11 || echo /root/.pyenv/versions/3.11.7/bin/python)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install run test bench openapi clean

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

test: install
	$(PY) -m pytest

bench: install
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) tests/benchmarks/bench_math.py --repeat 1
	$(PY) tests/benchmarks/bench_advantages.py
	$(PY) tests/benchmarks/bench_estimators.py

openapi: install
	$(VENV)/bin/rewardd openapi

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
