# The two commands of this repository, each setting up what is missing first:
#   make run    the embedded default study (configs/config.yaml) on every core
#   make test   the whole test suite, spread over every core (pytest-xdist)
# Set-up is setup.sh (a .venv with this package, editable, and the stack of constraints.txt); it runs again only when
# .venv is missing or pyproject.toml, constraints.txt or setup.sh is newer than the stamp it leaves.

VENV := .venv
STAMP := $(VENV)/.setup-done

.PHONY: run test setup

# the jobs' shell commands (python -m mohge ...) find the .venv's python first on PATH, as after `source
# .venv/bin/activate`; --rerun-incomplete: a run stopped by Ctrl-C picks up where it left off
SNAKEMAKE_ARGS ?= --cores all
# Every job and test process imports this checkout's modules: byte-compiled here once (fast when up to date), no
# process compiles them again (pip does not byte-compile an editable install, and CI images often set
# PYTHONDONTWRITEBYTECODE, which stops Python writing what it compiled)
PYC = $(VENV)/bin/python -m compileall -q -j 0 src studies kernels tests workflow/scripts
run: $(STAMP)
	$(PYC)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/snakemake --rerun-incomplete $(SNAKEMAKE_ARGS)

# loadgroup: tests marked with one xdist_group (one fresh clone, one trained model) run on one worker; PYTEST_ARGS: more
# of pytest's arguments, e.g. PYTEST_ARGS='-m "not slow and not multiprocess"' (CONTRIBUTING.md: the loops by marker)
PYTEST_ARGS ?=
test: $(STAMP)
	$(PYC)
	$(VENV)/bin/python -m pytest -n auto --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt setup.sh
	bash setup.sh
	touch $@
