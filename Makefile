# Two entry points, each creating .venv on a fresh machine first:
#   make demo   - the CPU demo end to end
#   make test   - lint + the test suite
VENV := .venv
STAMP := $(VENV)/.ub-installed
UB := $(VENV)/bin/ub
DEMO_DIR ?= runs/demo-play

.PHONY: demo test lint setup clean-demo

$(STAMP): requirements/cpu.lock pyproject.toml scripts/setup.sh
	scripts/setup.sh

setup: $(STAMP)

demo: $(STAMP)
	$(UB) model tiny
	$(UB) play --env TicTacToe-v0-train --games 64 --players model,random --out $(DEMO_DIR)
	$(UB) sql $(DEMO_DIR) "SELECT env_id, actor, count(*) AS decisions, round(avg(invalid_move::INT), 3) AS invalid_rate, round(avg(format_ok::INT), 3) AS format_rate FROM steps GROUP BY ALL ORDER BY actor"

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q

clean-demo:
	rm -rf $(DEMO_DIR)
