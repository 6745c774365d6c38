"""The one C extension, ``dyn.core.kv._xxh3`` (block and sequence hashes): everything else is in
pyproject.toml. It is optional: where no C compiler is found the install goes on and
``dyn.core.kv.hashing`` uses its Python path, which gives the same hashes more slowly."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dyn.core.kv._xxh3", ["core/kv/_xxh3.c"], optional=True, extra_compile_args=["-O2"])
    ]
)
