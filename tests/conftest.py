import pytest

from tests.etcd import etcd_server  # noqa: F401 (a fixture: a real etcd on free loopback ports)
from tests.waiting import poll_until

LOG_TAIL_CHARS = 6000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test's report ends with the tail of every live engine stack's log."""
    from tests.vllm_cpu import LIVE_LOGS

    report = yield
    if report.failed:
        for log in sorted(LIVE_LOGS):
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else "(no log)"
            report.sections.append((f"{log} (last {LOG_TAIL_CHARS} characters)", tail))
    return report


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` (15 s or more) run first. Collected in file order, the longest ran at
    the end, one worker busy with it alone while the other had nothing left to take."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def wait_for():
    """``wait_for(predicate, timeout, what)``: poll until truthy, else fail saying what was awaited
    (``tests.waiting.poll_until``)."""
    return poll_until
