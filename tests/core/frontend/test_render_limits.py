"""dyn.core.frontend.chat_template's render limits: a template (or the messages it is given) that
would build a huge string, list or number is stopped before it does, and one that runs past the
time limit is stopped there; ordinary templates render as before (test_chat_template.py compares
them with transformers)."""

from __future__ import annotations

import time

import pytest

from dyn.core.frontend.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    RenderLimitError,
    RenderLimits,
)

HI = [{"role": "user", "content": "hi"}]
LIMITS = RenderLimits(max_chars=1 << 20, max_seconds=0.5)
BIG = "{% set s = 'a' * 1000000 %}"

BOMBS = {
    "string repeat (the probe's)": "{{ 'a ' * 10000000 }}",
    "list repeat": "{{ [1] * 100000000 }}",
    "power": "{{ 10 ** 10000000 }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(100) %}{% set ns.x = ns.x * ns.x %}"
    "{% endfor %}",
    "doubling with ~": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "doubling without a loop": "{% set s = 'abcd' %}" + "{% set s = s ~ s %}" * 40 + "{{ s | length }}",
    "str.center": "{{ 'a'.center(1000000000) }}",
    "center filter": "{{ 'a' | center(1000000000) }}",
    "str.zfill": "{{ '1'.zfill(10 ** 9) }}",
    "printf width": "{{ '%1000000000d' % 1 }}",
    "printf star": "{{ '%*d' % (1000000000, 1) }}",
    "printf precision": "{{ '%.100000000f' % 1.5 }}",
    "format filter": "{{ '%1000000000s' | format('x') }}",
    "str.format width": "{{ '{:>1000000000}'.format('x') }}",
    "str.format nested width": "{{ '{:{}}'.format('x', 1000000000) }}",
    "str.replace growth": "{% set ns = namespace(s='aaaaaaaa') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s.replace('a', 'aaaa') %}{% endfor %}",
    "replace filter growth": "{% set ns = namespace(s='aaaaaaaa') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s | replace('a', 'aaaa') %}{% endfor %}",
    "join filter": BIG + "{{ ([s] * 1000) | join }}",
    "str.join": BIG + "{{ ''.join([s] * 1000) }}",
    "printing a list": BIG + "{{ [s] * 1000 }}",
    "printing a dict": BIG + "{{ dict(a=[s] * 1000) }}",
    "string filter": BIG + "{{ ([s] * 1000) | string | length }}",
    "tojson": BIG + "{{ ([s] * 1000) | tojson }}",
    "tojson indent": "{{ messages | tojson(indent=100000000) }}",
    "indent filter": "{{ ('a\n' * 500000) | indent(1000) }}",
    "wordwrap": "{{ ('a ' * 100000) | wordwrap(1, wrapstring='x' * 1000) }}",
    "expandtabs": "{{ ('\t' * 1000).expandtabs(1000000) }}",
    "batch fill": "{{ [1] | batch(1000000000, 0) | list }}",
    "slice count": "{{ [1] | slice(1000000000) | list }}",
    "sum of lists": BIG + "{{ ([[s] * 1000] * 1000) | sum(start=[]) | length }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "output in a loop": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "nested loops printing nothing": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
    "{% endfor %}",
    "nested loops over a string": "{% set s = 'a' * 100000 %}{% for i in s %}{% for j in s %}{% endfor %}"
    "{% endfor %}",
    "exponential macro": "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
    "{{ f(60) }}",
}


@pytest.mark.parametrize("source", BOMBS.values(), ids=BOMBS.keys())
def test_bomb_stops_early(source: str) -> None:
    start = time.perf_counter()
    with pytest.raises(RenderLimitError):
        ChatTemplate(source).render(HI, limits=LIMITS)
    took = time.perf_counter() - start
    assert took < LIMITS.max_seconds + 0.5, took


@pytest.mark.parametrize(
    "source",
    [
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",  # unbounded recursion
        "{{ range(1000000000) | list | length }}",  # the sandbox's own range cap
    ],
)
def test_other_runaways_are_template_errors(source: str) -> None:
    with pytest.raises(ChatTemplateError):
        ChatTemplate(source).render(HI, limits=LIMITS)


def test_limits_leave_ordinary_work_alone() -> None:
    source = (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ '<|' + m.role + '|>' ~ m.content | center(9) }}{{ '%-3s' % ns.n }}{{ ', '.join(['a', 'b']) }}"
        "{{ '{:>4}'.format(loop.index) }}{{ ([m.role] * 2) | join('/') }}"
        "{{ m | tojson(indent=2) | length }}"
        "{% endfor %}{{ 2 ** 10 }}"
    )
    out = ChatTemplate(source).render([{"role": "user", "content": "hi"}] * 3, limits=LIMITS)
    as_json = '{\n  "role": "user",\n  "content": "hi"\n}'
    turn = "<|user|>" + "hi".center(9) + "{:<3}a, b{:>4}user/user" + str(len(as_json))
    assert out == "".join(turn.format(i, i) for i in (1, 2, 3)) + "1024"


def test_output_limit_is_exact_and_the_default_is_generous() -> None:
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    messages = [{"role": "user", "content": "x" * 1000}] * 100
    assert len(template.render(messages, limits=RenderLimits(max_chars=100_000))) == 100_000
    with pytest.raises(RenderLimitError, match="output"):
        template.render(messages, limits=RenderLimits(max_chars=99_999))
    assert len(template.render(messages)) == 100_000


def test_hostile_messages_cannot_run_away_with_the_models_template() -> None:
    """A (trusted) model template that compares every message with every other: harmless for a
    real conversation, a runaway for 30,000 one-character messages; stopped at the time limit."""
    quadratic = (
        "{% set ns = namespace(dup=0) %}{% for a in messages %}{% for b in messages %}"
        "{% if a.content == b.content %}{% set ns.dup = ns.dup + 1 %}{% endif %}"
        "{% endfor %}{% endfor %}"
        "{{ ns.dup }}"
    )
    template = ChatTemplate(quadratic)
    assert template.render([{"role": "user", "content": str(i)} for i in range(20)], limits=LIMITS) == "20"
    start = time.perf_counter()
    with pytest.raises(RenderLimitError, match="took more than 0.5 s"):
        template.render([{"role": "user", "content": "x"}] * 30_000, limits=LIMITS)
    assert time.perf_counter() - start < LIMITS.max_seconds + 0.5


def test_limits_are_per_rendering_and_per_thread() -> None:
    import threading

    template = ChatTemplate(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    )
    quick = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    errors: list[Exception] = []

    def slow() -> None:
        try:
            template.render(HI, limits=RenderLimits(max_seconds=0.3))
        except RenderLimitError as exc:
            errors.append(exc)

    thread = threading.Thread(target=slow)
    thread.start()
    # meanwhile this thread renders with its own (generous) limits
    for _ in range(50):
        assert quick.render(HI, limits=RenderLimits(max_seconds=30)) == "hi"
    thread.join(10)
    assert len(errors) == 1


def test_string_and_pprint_filters_print_their_value() -> None:
    """Jinja's ``string`` filter (jinja2/filters.py maps it to markupsafe's ``soft_str``), bounded
    here; ``pprint`` prints the same way. Model templates use it on tool arguments and ids."""
    source = (
        "{{ messages[0].content | string }}|{{ [1, 'a'] | string }}|{{ {'k': 2} | pprint }}|{{ 7 | string }}"
    )
    assert ChatTemplate(source).render(HI, limits=LIMITS) == "hi|[1, 'a']|{'k': 2}|7"
