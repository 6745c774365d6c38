"""Fresh request ids: the frontend names every request that came without an id of its own."""

from __future__ import annotations

import os
import re

from dyn.core.frontend.endpoints.generate import _request_id


def test_fresh_request_ids_are_distinct_hex_and_a_forked_child_draws_its_own():
    ids = {_request_id(None, None) for _ in range(10_000)}
    assert len(ids) == 10_000 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert _request_id(b"mine", None) == "mine" and _request_id(None, "body-id") == "body-id"
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out without pytest's teardown
        os.write(write, _request_id(None, None).encode())
        os._exit(0)
    os.close(write)
    try:
        assert os.waitpid(pid, 0)[1] == 0
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
    assert re.fullmatch(r"[0-9a-f]{32}", child) and child != _request_id(None, None)
