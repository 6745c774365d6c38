"""dyn's record of SGLang streaming sessions: how each turn is sent."""

from dyn.plugins.sglang.sessions import SessionTable, TurnPlan


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_turns_send_the_whole_prompt_first_then_only_what_is_new():
    table = SessionTable(Clock())
    table.opened("s", 60.0)
    first = table.plan("s", [1, 2, 3])
    assert first == TurnPlan("first", [1, 2, 3], "s")
    assert table.plan("s", [1, 2, 3, 4]) == TurnPlan("ordinary", [1, 2, 3, 4])  # one turn at a time
    table.finished(first, [1, 2, 3], [7, 2])
    assert table.held_tokens() == 5
    append = table.plan("s", [1, 2, 3, 7, 2, 9, 9])
    assert append == TurnPlan("append", [9, 9], "s")
    table.finished(append, [1, 2, 3, 7, 2, 9, 9], [8])
    assert table.held_tokens() == 8


def test_a_prompt_that_does_not_extend_the_history_restarts_the_session():
    table = SessionTable(Clock())
    table.opened("s", 60.0)
    table.finished(table.plan("s", [1, 2]), [1, 2], [3])
    assert table.plan("s", [1, 2, 4, 5]) == TurnPlan("restart", [1, 2, 4, 5], "s")
    table.finished(TurnPlan("restart", [1, 2, 4, 5], "s"), [1, 2, 4, 5], None)  # aborted: unknown
    assert table.plan("s", [1, 2, 4, 5, 6]).kind == "restart"


def test_unknown_closed_and_idle_sessions_are_served_as_ordinary_requests():
    clock = Clock()
    table = SessionTable(clock)
    assert table.plan("nope", [1]) == TurnPlan("ordinary", [1])
    assert table.plan(None, [1]) == TurnPlan("ordinary", [1])
    table.opened("s", 10.0)
    clock.now += 8.5
    assert table.get("s") is not None
    clock.now += 1.0  # within a second of SGLang's reaper: treated as gone
    assert table.get("s") is None and len(table) == 0
    assert table.plan("s", [1]).kind == "ordinary"
    table.opened("t", 10.0)
    assert table.closed("t") and not table.closed("t")


def test_the_idle_clock_runs_from_the_open_and_each_turns_start_as_sglangs_does():
    clock = Clock()
    table = SessionTable(clock)
    table.opened("s", 10.0)
    clock.now = 105.0
    turn = table.plan("s", [1])  # SGLang restarts its idle clock here (Session.create_req)
    clock.now = 113.0  # the turn ran 8 s
    table.finished(turn, [1], [2])
    assert table.get("s") is not None
    clock.now = 114.5  # SGLang reaps it after 115: dyn has let it go already
    assert table.get("s") is None
    table.opened("t", 10.0, since=clock.now - 9.5)  # the open was asked for 9.5 s ago
    assert table.get("t") is None
