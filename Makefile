# Two entry points, each creating .venv on a fresh machine first:
#   make demo   - the CPU demo end to end
#   make test   - lint (ruff), type check (mypy) + the test suite on two pytest-xdist workers
#                 (one test module per worker; the tiny model is built first, alone: built
#                 inside a test, the other worker's tests would compete with it for the cores)
VENV := .venv
STAMP := $(VENV)/.ub-installed
UB := $(VENV)/bin/ub
DEMO_RUN ?= demo

.PHONY: demo test lint setup clean-demo

$(STAMP): requirements/cpu.lock pyproject.toml scripts/setup.sh
	scripts/setup.sh

setup: $(STAMP)

demo: $(STAMP)
	$(UB) model tiny
	$(UB) train tiny-cpu --run $(DEMO_RUN)
	$(UB) sql runs/$(DEMO_RUN) "SELECT round, count(*) AS decisions, round(avg(invalid_move::INT), 3) AS invalid_rate, round(avg(num_completion_tokens), 1) AS completion_tokens FROM steps GROUP BY round ORDER BY round"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m mypy
	$(UB) model tiny
	$(VENV)/bin/python -m pytest -q -n 2 --durations=30

clean-demo:
	rm -rf runs/$(DEMO_RUN)
