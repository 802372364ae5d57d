# Two commands a newcomer needs: `make run` and `make test`. Everything else is plumbing.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
STATE  ?= examples/cluster
HOST   ?= 127.0.0.1
PORT   ?= 8443

.PHONY: run test lint bench bench-instructions certs venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

certs/tls.crt: | $(STAMP)
	$(BIN)/scheduling-webhook certs --out certs --hostname localhost --ip 127.0.0.1

certs: certs/tls.crt

run: $(STAMP) certs/tls.crt
	$(BIN)/scheduling-webhook serve --state $(STATE) --certs certs --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# pytest exits 5 when it collected nothing: that must fail, never pass silently.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest ran no tests"; exit 1; fi; exit $$rc

bench: $(STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# Instructions per request under valgrind: the figure that stays put on a noisy machine.
bench-instructions: $(STAMP)
	@command -v valgrind >/dev/null || { echo "needs valgrind: apt-get install valgrind"; exit 2; }
	$(BIN)/python -m bench.instructions $(BENCH_ARGS)

clean:
	rm -rf $(VENV) certs/*.crt certs/*.key .pytest_cache
