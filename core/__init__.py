"""dyn.core: everything engine-agnostic (protocol, KV hashing and events, transport, discovery, worker host)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dyn")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
