# managed-scorers: `make demo` and `make test` build everything they need from scratch.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
SCORER_ENVS := math image embed ocr engine code
# trainer envs: the GRPO and torchrun tests run in envs/trl (TRL + torch CPU + this project), the Ray test in envs/ray
TRAINER_ENVS := trl ray
# bench envs: what `make bench` runs beyond the scorer envs; `make test` builds them too, for the bench's smoke tests
BENCH_ENVS := trlbench
ENVS := $(SCORER_ENVS) $(TRAINER_ENVS) $(BENCH_ENVS)
PYTEST_ARGS ?=
# The envs of `make test` and `make envs` install with uv (in .venv from requirements-dev.txt), under
# pip's index and constraints (`envs build --installer uv`): the same versions as pip picks, the eight
# envs in about 2 minutes instead of 8 on two cores. `make envs ENV_INSTALLER=pip` builds with pip.
ENV_INSTALLER ?= uv
BUILD := $(VPY) -m supervisor envs build --installer $(ENV_INSTALLER)

.PHONY: install envs scorer-envs demo demo-install tour test test-fast lint docs bench bench-peers gpu-check clean $(addprefix env-,$(ENVS))

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml requirements-dev.txt
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --no-input -e '.[serving,metrics]' -r requirements-dev.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(VPY) -m pip check
	touch $@

# Scorer envs are built by the same code as `managed-scorers envs build` (specs in supervisor/env_specs/),
# into envs/NAME/.venv, and only when their pins changed.
$(addprefix env-,$(SCORER_ENVS)): env-%: install
	$(BUILD) $* --python $(PYTHON)

env-trl: install
	$(BUILD) trl --requirements envs/trl/requirements.txt --dir envs/trl/.venv --python $(PYTHON)

# for bench/trl_step.py (and its smoke test): TRL with its in-process graders where they grade right (antlr 4.13.2)
env-trlbench: install
	$(BUILD) trlbench --requirements envs/trlbench/requirements.txt --dir envs/trlbench/.venv \
		--python $(PYTHON)

# Ray is optional for this project: where it cannot be installed (no wheel for this platform or
# Python), the build's reason goes to envs/ray/UNAVAILABLE and the Ray test skips, saying it.
env-ray: install
	rm -f envs/ray/UNAVAILABLE
	if ! $(BUILD) ray --requirements envs/ray/requirements.txt --dir envs/ray/.venv \
			--python $(PYTHON) 2> envs/ray/.build-stderr; then \
		cat envs/ray/.build-stderr >&2; tail -c 4000 envs/ray/.build-stderr > envs/ray/UNAVAILABLE; \
		echo "envs/ray could not be built: the Ray test will skip, citing envs/ray/UNAVAILABLE" >&2; \
	fi

envs: $(addprefix env-,$(ENVS))

scorer-envs: $(addprefix env-,$(SCORER_ENVS))

# `make demo`: the antlr story, math only, no torch, no dev tools: its own venv (.venv-demo) holds this
# package (editable) and a trainer's in-process grader under hydra-core 1.3.2's antlr 4.9.3 pin; the math
# env builds meanwhile (the same builder as `managed-scorers envs build math`). No pip in .venv-demo and no
# .pyc compiled ahead: $(PYTHON)'s pip installs into it (pip >= 22.3): 12 s of CPU here against 36 s.
# `make tour` adds the image, OCR and MiniLM (torch) envs and a GRPO panel, from the dev env.
DEMO_VENV := .venv-demo
DEMO_PY := $(DEMO_VENV)/bin/python
DEMO_PIP := $(PYTHON) -m pip --python $(DEMO_PY) install -q --no-input --no-compile

demo-install: $(DEMO_VENV)/.installed

$(DEMO_VENV)/.installed: pyproject.toml
	rm -rf $(DEMO_VENV)
	$(PYTHON) -m venv --without-pip $(DEMO_VENV)
	$(DEMO_PIP) -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
	$(DEMO_PY) -m supervisor envs build math --python $(PYTHON) & math=$$!; \
	$(DEMO_PIP) hydra-core==1.3.2 math-verify==0.9.0 2>&1 | { grep -v "^WARNING: Location" || true; }; \
	wait $$math
	touch $@

demo: demo-install
	$(DEMO_PY) -m supervisor demo

tour: install scorer-envs
	$(VPY) -m supervisor demo --tour

# --durations: CI prints the 25 slowest tests, so a test that grew slow is seen where it runs
test: install envs lint docs
	$(VPY) -m pytest -q --durations=25 $(PYTEST_ARGS)

# The docs site, built strictly: a broken link, a missing page or a reference page that no longer
# generates (docs/gen_reference.py) fails it. The snippets in the pages run in pytest (tests/docs).
docs: install
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VPY) -m mkdocs build --strict --site-dir site

lint: install
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .
	$(VPY) -m mypy

test-fast: install envs
	$(VPY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

bench: install scorer-envs env-trlbench
	$(VPY) -m bench

bench-peers: install env-image
	$(VPY) -m bench.peers

gpu-check: install env-embed env-engine
	$(VPY) -m bench.gpu_residency --engine-python envs/engine/.venv/bin/python

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(addprefix envs/,$(addsuffix /.venv,$(ENVS))) envs/ray/UNAVAILABLE envs/ray/.build-stderr bench/.peers-venv build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
