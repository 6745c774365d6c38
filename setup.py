"""The C extensions of ``dyn.core.kv``: ``_xxh3`` (block and sequence hashes) and ``_radix`` (the
prefix index's tree); everything else is in pyproject.toml. Both are optional: where no C compiler
is found the install goes on, ``dyn.core.kv.hashing`` uses its Python path (the same hashes, more
slowly) and ``RadixIndexer`` its Python tree (the same answers, more memory and time)."""

from setuptools import Extension, setup


def _extension(name: str) -> Extension:
    return Extension(
        f"dyn.core.kv.{name}",
        [f"core/kv/{name}.c"],
        depends=["core/kv/xxh3.h"],
        optional=True,
        extra_compile_args=["-O2"],
    )


setup(ext_modules=[_extension("_xxh3"), _extension("_radix")])
