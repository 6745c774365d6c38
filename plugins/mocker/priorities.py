"""How each engine flavour reads ``GenerateRequest.priority`` (already in the engine's convention).

- **vLLM** (``--scheduling-policy priority``): the waiting queue is ordered by
  ``(priority, arrival)``, smaller first, a missing priority counting as 0; when KV blocks run
  out the preemption victim is the running request with the largest ``(priority, arrival)``
  (vLLM v1's ``max(self.running, key=lambda r: (r.priority, r.arrival_time))``).
- **SGLang** (``--enable-priority-scheduling``): larger values first, or smaller ones with
  ``--schedule-low-priority-values-first``; ties by arrival. A missing priority is the least
  important one (SGLang's ``_set_or_validate_priority`` assigns ``-sys.maxsize - 1``, or
  ``sys.maxsize`` with low-values-first). The preemption victim stays ``--preemption-mode``'s
  (SGLang's retraction does not look at priority).
- **Importance** (``--radix-eviction-policy priority``): the number a cached block keeps, larger
  meaning kept longer: the raw priority, whatever the scheduling order (SGLang 0.5.23's
  ``PriorityStrategy`` evicts smaller values first even with low-values-first, so there the
  blocks of the most urgent requests go first). A missing priority counts as 0 (SGLang's radix
  insert turns ``None`` into 0) unless priority scheduling is on, where it is the default SGLang
  assigned before the insert: the smallest value, or the largest with low-values-first.

Without priority scheduling the priority is ignored for ordering (plain FCFS).
"""

from __future__ import annotations

from collections.abc import Callable

from dyn.core.messages import PriorityOrder
from dyn.plugins.mocker.config import MockerConfig

LEAST = float("inf")
"""Waiting-queue key of a request that goes after every prioritised one."""
LEAST_IMPORTANT = float("-inf")


def priority_order(config: MockerConfig) -> PriorityOrder:
    """``EngineInfo.priority_order``: vLLM and SGLang-with-low-values-first read smaller values as
    more important (``lower_first``); SGLang's default is ``higher_first``. Independent of whether
    scheduling by priority is on."""
    if config.is_sglang and not config.schedule_low_priority_values_first:
        return "higher_first"
    return "lower_first"


def waiting_key(config: MockerConfig) -> Callable[[int | None], float] | None:
    """Priority -> waiting-queue key (smaller admitted first; ties by arrival), or None for FCFS."""
    if config.is_sglang:
        if not config.enable_priority_scheduling:
            return None
        if config.schedule_low_priority_values_first:
            return lambda p: LEAST if p is None else p
        return lambda p: LEAST if p is None else -p
    if config.scheduling_policy == "priority":
        return lambda p: 0 if p is None else p
    return None


def importance(config: MockerConfig) -> Callable[[int | None], float] | None:
    """Priority -> cache-block importance for priority eviction, or None when eviction is LRU."""
    if not config.is_sglang or config.radix_eviction_policy != "priority":
        return None
    missing: float = 0
    if config.enable_priority_scheduling:
        missing = -LEAST_IMPORTANT if config.schedule_low_priority_values_first else LEAST_IMPORTANT
    return lambda p: missing if p is None else p


def uses_priority_victim(config: MockerConfig) -> bool:
    """Whether preemption picks vLLM's lowest-priority victim instead of lifo/fifo."""
    return not config.is_sglang and config.scheduling_policy == "priority"
