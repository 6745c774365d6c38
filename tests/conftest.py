import pytest

from tests.etcd import etcd_server  # noqa: F401 (a fixture: a real etcd on free loopback ports)
from tests.waiting import poll_until


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def wait_for():
    """``wait_for(predicate, timeout, what)``: poll until truthy, else fail saying what was awaited
    (``tests.waiting.poll_until``)."""
    return poll_until
