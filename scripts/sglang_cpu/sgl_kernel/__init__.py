"""``sgl_kernel`` for a CPU venv without SGLang's CPU kernels: every name imports, none runs.

SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``, ``--device cpu``) imports some of its
``sgl-kernel`` CPU ops at module level (``from sgl_kernel import assign_req_to_token_pool_cpu``, ...)
but calls them only on its Intel AMX paths, which it enables when ``torch.ops.sgl_kernel`` has the
compiled ops (``sglang.srt.utils.common.cpu_has_amx_support``). Those ops are built from SGLang's
source (``sgl-kernel/csrc/cpu``); PyPI carries only CUDA builds of ``sglang-kernel``. This module,
which scripts/provision_sglang_cpu.sh installs only where no ``sgl_kernel`` imports, lets those
imports succeed; it registers no torch op, so SGLang runs its torch-native paths (SDPA attention,
native norms and activations). A call that reaches one of these names anyway raises at once, naming
the op, instead of computing anything.
"""

from __future__ import annotations

from typing import NoReturn

PROVIDES_KERNELS = False
"""Read by dyn's tests: this is not SGLang's kernel build."""


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def not_built(*_args: object, **_kwargs: object) -> NoReturn:
        raise NotImplementedError(
            f"sgl_kernel.{name} is one of SGLang's compiled CPU kernels, which this venv does not "
            "have (PyPI has only CUDA builds of sglang-kernel); build sgl-kernel for CPU from "
            "SGLang's source to run its AMX paths"
        )

    not_built.__name__ = name
    return not_built
