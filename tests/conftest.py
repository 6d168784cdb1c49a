import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.support.engine_client import EngineHost

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


_ALL_CPUS = sorted(os.sched_getaffinity(0))
"""The cores this test session was given, before a parallel worker took its share."""


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker (and every engine, redis-server and helper process it
    starts) runs on its own share of the cores. Engines size their compute threads from
    the cores they may use, so two workers never oversubscribe the machine with two
    engines' OpenMP threads spinning on the same cores, and every engine a test compares
    with its baseline runs with the same threads as that baseline (one worker holds both)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker.startswith("gw") and 1 < count <= len(_ALL_CPUS):
        os.sched_setaffinity(0, _ALL_CPUS[int(worker[2:]) :: count])


@pytest.fixture(scope="session")
def engine_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineHost]:
    """This worker's engine host (tests/support/engine_client.py); its process starts on
    first use."""
    host = EngineHost(tmp_path_factory.mktemp("engine-host"))
    yield host
    host.close()


@pytest.fixture
def all_cores() -> Iterator[list[int]]:
    """Every core of the session for one test (a TP=2 engine needs two), then the
    worker's share again."""
    mine = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, _ALL_CPUS)
    try:
        yield _ALL_CPUS
    finally:
        os.sched_setaffinity(0, mine)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # pytest-xdist's loadgroup keeps a group on one worker: by default a group is a
    # module, so its module-scoped engines and servers start once; a module may split
    # itself with explicit xdist_group marks (each part then starts its own).
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else ""))
    if config.getoption("-m"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
