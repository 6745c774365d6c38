"""The metric names a PromQL query reads, and the queries of a Grafana dashboard.

Enough of PromQL for dashboards: string literals, label matchers (``{...}``), ranges and
subqueries (``[...]``), and grouping clauses (``by``, ``without``, ``on``, ``ignoring``,
``group_left``, ``group_right``) are dropped; what is left that is an identifier and is not
called as a function, nor a keyword, is a metric name. Grafana's ``label_values(METRIC, LABEL)``
template query names its metric as first argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
KEYWORDS |= {"offset", "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(?!\s*\()")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` reads."""
    found = _LABEL_VALUES.match(expr)
    if found:
        return {found.group(1)}
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {name for name in _IDENTIFIER.findall(text) if name.lower() not in KEYWORDS}


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, query)`` for every PromQL query of a Grafana dashboard: its panels' targets
    (rows' nested panels too) and its query variables."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            yield f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            yield f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query
