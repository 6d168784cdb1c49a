# kvtier: `make bench` runs the main job, `make test` the test suite; both set up .venv first.
PY := .venv/bin/python

.PHONY: setup test test-all test-floors lint bench clean

setup:
	@scripts/setup.sh

# Two workers, each on its own core (tests/conftest.py); a module's tests stay on one worker
# unless it splits itself with xdist_group marks.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadgroup

test: setup
	$(PYTEST)

test-all: setup
	$(PYTEST) -m "slow or not slow"

# The remote tier's tests on the oldest redis / hiredis pyproject.toml allows (temporary dir).
test-floors: setup
	scripts/test_floors.sh

lint: setup
	.venv/bin/ruff check src tests benchmarks examples
	.venv/bin/ruff format --check src tests benchmarks examples
	.venv/bin/mypy
	.venv/bin/mkdocs build --strict --quiet --site-dir .site

bench: setup
	.venv/bin/kvtier bench

clean:
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache
