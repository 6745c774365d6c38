"""dyn's C extensions: ``dyn.core.kv._xxh3`` (block and sequence hashes), ``dyn.core.kv._radix``
(the prefix index's tree), ``dyn.core.router._block_refs`` (a rank's active block refcounts, the
blocks one rank alone holds) and ``dyn.core.bench._mt`` (a trace block's seeded token draws);
everything else is in pyproject.toml.
All are optional: where no C compiler is found the install goes on and each has a Python path
with the same results, slower (``dyn.core.kv.hashing``, ``dyn.core.kv.indexer_py``,
``dyn.core.router.block_refs``, ``dyn.core.router.holders``, ``dyn.core.bench.trace``)."""

from setuptools import Extension, setup


def _extension(package: str, name: str) -> Extension:
    return Extension(
        f"dyn.core.{package}.{name}",
        [f"core/{package}/{name}.c"],
        depends=["core/kv/xxh3.h", "core/kv/u64map.h", "core/kv/u64int.h"],
        optional=True,
        extra_compile_args=["-O2"],
    )


setup(
    ext_modules=[
        _extension("kv", "_xxh3"),
        _extension("kv", "_radix"),
        _extension("router", "_block_refs"),
        _extension("bench", "_mt"),
    ]
)
