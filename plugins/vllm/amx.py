"""A vLLM general plugin: AMX tiles allowed in every vLLM process that runs on a CPU with them.

Linux lets a process use Intel AMX's tile registers only after it asks
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``); an AMX instruction before that is SIGILL. vLLM 0.32's CPU
attention takes its AMX kernel on such a CPU (bfloat16, blocks a multiple of 32) and never asks:
it works only once oneDNN, which asks for itself, has run an AMX matrix product in that process.
A first prompt of a token or two is too small for that, and the engine's worker process died on it
(exit code -4) before it answered anything. vLLM runs its ``vllm.general_plugins`` entry points in
each of its processes before the model runs (dyn registers this one: ``pyproject.toml``), so each
asks here, through torch (``torch._C._cpu._init_amx``). Anywhere else this does nothing.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def allow_amx_tiles() -> None:
    """Ask the kernel for AMX tiles when this vLLM process runs on a CPU that has them; never
    raises (a plugin that raised would stop vLLM's start)."""
    try:
        import torch
        from vllm.platforms import current_platform

        if current_platform.is_cpu() and torch.cpu._is_amx_tile_supported():
            if not torch._C._cpu._init_amx():
                log.warning("the kernel refused AMX tiles; vLLM's AMX kernels will fail on this CPU")
    except Exception as exc:  # an older torch or vLLM without these names: nothing to ask
        log.debug("AMX tiles not requested: %s", exc)
