"""The ZMQ sockets of every plane: contexts, binding, and the CurveZMQ keys that secure them.

Every socket dyn makes goes through ``configure`` when it is made and through ``bind`` (or
``bind_random``) when it listens, so one switch, ``use_plane_keys(directory)``, secures them all:

- without keys (the default), sockets are plain ZMQ and may only listen on a loopback address;
  ``bind`` refuses any other address with a ``PlaneKeyError`` naming ``--plane-keys``;
- with keys, every socket ``configure`` makes is a CurveZMQ client that knows the planes' server
  public key, and every socket ``bind`` listens on becomes a CurveZMQ server that accepts only
  clients whose public key is one of the directory's ``*.key`` files (a ZAP handler per ZMQ
  context checks each new connection; a server socket without a handler refuses everyone).
  Traffic is encrypted and authenticated; a peer without a listed key cannot get a frame in.

The key directory (``dyn keys DIR`` writes one) holds ``server.key`` (public) and
``server.key_secret`` (needed only to listen), ``client.key`` and ``client.key_secret``, each
0600, in a directory only its owner may enter (0700). Every process of a deployment uses a copy
of the same directory: one trust domain, one server identity. Another client may be admitted by
adding its public ``NAME.key`` file.

Under plane keys no dyn socket connects to a plain one, with one exception: a worker relaying
its own engine's KV events (vLLM and SGLang bind their publishers themselves, in plain ZMQ) reads
them with ``plain`` sockets at a ``private_endpoint``, which no other user or host can reach
(``dyn.core.worker.kv_relay``).

A listening socket has two addresses: the one it binds (``--host``: an interface address, or a
wildcard, ``0.0.0.0`` / ``::``, for every interface) and the one its peers connect to, which goes
into discovery (``--advertise-host``). ``bind`` returns the advertised endpoint, so no caller
formats one: the process's ``use_advertise_host`` address if set, else the bind host, else (for a
wildcard) ``primary_address``. ``advertised_host`` gives the same answer for sockets a process
does not bind itself (the engines' own KV-event publishers).
"""

from __future__ import annotations

import atexit
import functools
import ipaddress
import itertools
import logging
import os
import random
import shutil
import socket as _socket
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import zmq
import zmq.asyncio
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from dyn.core.errors import ConfigError
from dyn.core.private_dir import check_private_dir

log = logging.getLogger(__name__)

ZAP_DOMAIN = "dyn"
SERVER_KEY = "server"
CLIENT_KEY = "client"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"


def async_context() -> zmq.asyncio.Context:
    """The process-wide asyncio ZMQ context."""
    return zmq.asyncio.Context.instance()


def sync_context() -> zmq.Context:
    """The process-wide plain ZMQ context, for sockets that never block (PUB)."""
    return zmq.Context.instance()


class PlaneKeyError(ConfigError):
    """``--plane-keys`` names a directory that does not hold usable CurveZMQ keys, or a socket
    would listen beyond loopback without them."""


@dataclass(frozen=True)
class PlaneKeys:
    """The CurveZMQ keys of one process (Z85 bytes); ``server_secret`` None: it cannot listen."""

    directory: Path
    server_public: bytes
    server_secret: bytes | None
    client_public: bytes
    client_secret: bytes


def load_plane_keys(directory: str | Path) -> PlaneKeys:
    """Read and check a key directory (see the module docstring); ``PlaneKeyError`` says what
    is wrong and how to fix it."""
    path = Path(directory).expanduser()
    fix = f"make one with 'dyn keys DIR', or run 'chmod 700 {path}'"
    try:
        info = check_private_dir(path, "--plane-keys directory", fix)
    except ConfigError as exc:
        raise PlaneKeyError(str(exc)) from None
    if info.st_mode & 0o077:
        raise PlaneKeyError(
            f"--plane-keys directory {path} is open to other users (mode "
            f"{stat.S_IMODE(info.st_mode):o}); run 'chmod 700 {path}'"
        )
    for secret in sorted(path.glob(f"*{SECRET_SUFFIX}")):
        mode = os.stat(secret)
        if mode.st_uid != os.geteuid() or mode.st_mode & 0o077:
            raise PlaneKeyError(
                f"secret key {secret} is readable by other users or not yours "
                f"(mode {stat.S_IMODE(mode.st_mode):o}); run 'chmod 600 {secret}'"
            )
    server_public, _ = _read_key(path / f"{SERVER_KEY}{PUBLIC_SUFFIX}", secret=False)
    server_secret = None
    if (path / f"{SERVER_KEY}{SECRET_SUFFIX}").exists():
        public, server_secret = _read_key(path / f"{SERVER_KEY}{SECRET_SUFFIX}", secret=True)
        if public != server_public:
            raise PlaneKeyError(
                f"{path}: {SERVER_KEY}{PUBLIC_SUFFIX} and {SERVER_KEY}{SECRET_SUFFIX} "
                "are not one keypair; make the directory again with 'dyn keys'"
            )
    client_public, client_secret = _read_key(path / f"{CLIENT_KEY}{SECRET_SUFFIX}", secret=True)
    assert client_secret is not None
    return PlaneKeys(path, server_public, server_secret, client_public, client_secret)


def _read_key(file: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret_key = zmq.auth.load_certificate(file)
    except (OSError, ValueError) as exc:
        raise PlaneKeyError(
            f"cannot read the CurveZMQ key {file}: {exc}; make the directory with 'dyn keys DIR'"
        ) from None
    if len(public or b"") != 40 or (secret and len(secret_key or b"") != 40):
        raise PlaneKeyError(
            f"{file} does not hold a CurveZMQ {'secret' if secret else 'public'} "
            "key; make the directory with 'dyn keys DIR'"
        )
    return public, secret_key


def write_plane_keys(directory: str | Path) -> Path:
    """Make a key directory (0700) with a server and a client keypair (files 0600, written
    with those modes from the start); ``PlaneKeyError`` if it already holds keys or cannot
    be made private."""
    path = Path(directory).expanduser()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise PlaneKeyError(f"cannot make {path}: {exc.strerror}") from None
    check_private_dir(path, "key directory", f"choose another directory or run 'chmod 700 {path}'")
    os.chmod(path, 0o700)
    names = [f"{n}{s}" for n in (SERVER_KEY, CLIENT_KEY) for s in (PUBLIC_SUFFIX, SECRET_SUFFIX)]
    present = [n for n in names if (path / n).exists()]
    if present:
        raise PlaneKeyError(
            f"{path} already holds keys ({', '.join(present)}); remove them first or choose another directory"
        )
    for name in (SERVER_KEY, CLIENT_KEY):
        public, secret = zmq.curve_keypair()
        _write_key(path / f"{name}{PUBLIC_SUFFIX}", public, None)
        _write_key(path / f"{name}{SECRET_SUFFIX}", public, secret)
    return path


def _write_key(file: Path, public: bytes, secret: bytes | None) -> None:
    """One key file in the ZeroMQ certificate format ``zmq.auth.load_certificate`` reads."""
    lines = [
        "#   dyn plane key (CurveZMQ): made by 'dyn keys'",
        "metadata",
        "curve",
        f'    public-key = "{public.decode()}"',
    ]
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")


_keys: PlaneKeys | None = None
_authenticators: list[ThreadAuthenticator] = []


def use_plane_keys(directory: str | Path | None) -> PlaneKeys | None:
    """Secure every ZMQ socket this process makes from now on with the CurveZMQ keys in
    ``directory``; None turns them off again (plain sockets, loopback only). Starts one ZAP
    handler thread per ZMQ context. ``PlaneKeyError`` when the directory is unusable."""
    global _keys
    keys = load_plane_keys(directory) if directory is not None else None
    for authenticator in _authenticators:
        authenticator.stop()
    _authenticators.clear()
    _keys = keys
    if keys is None:
        return None
    for context in (async_context(), sync_context()):
        authenticator = _start_authenticator(context)
        authenticator.configure_curve(domain=ZAP_DOMAIN, location=str(keys.directory))
        _authenticators.append(authenticator)
    return keys


def _start_authenticator(context: zmq.Context, attempts: int = 50) -> ThreadAuthenticator:
    """A started ZAP handler on ``context``. libzmq releases the ZAP socket's inproc address
    (``inproc://zeromq.zap.01``) in its reaper thread after the stopped handler closed it, so
    binding it again at once may find it still taken: retry for up to half a second."""
    for attempt in range(attempts):
        authenticator = ThreadAuthenticator(zmq.Context.shadow(context.underlying))
        try:
            authenticator.start()
            return authenticator
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or attempt == attempts - 1:
                raise
            authenticator.stop()
            time.sleep(0.01)
    raise AssertionError("unreachable")


def plane_keys() -> PlaneKeys | None:
    """The keys ``use_plane_keys`` set, if any."""
    return _keys


def warn_open_plane(logger: logging.Logger, api_key: str | None, endpoint: str) -> None:
    """Warn on ``logger`` that the ZMQ port at ``endpoint`` answers every local user when an
    ``api_key`` guards only HTTP, that is without ``--plane-keys``."""
    if api_key and plane_keys() is None:
        logger.warning(
            "the ZMQ query port %s answers every local user without the API key (--api-key guards "
            "HTTP only); --plane-keys DIR closes it to holders of the keys (make them with 'dyn keys DIR')",
            endpoint,
        )


SocketT = TypeVar("SocketT", bound="zmq.Socket[Any]")

DRAIN_BATCH = 64
"""Messages a receive loop takes per event-loop turn at most: enough that a busy process (turns
of milliseconds under load) keeps up with its peers, few enough that a flood cannot starve the
process's other tasks."""


def plain_view(socket: zmq.Socket[Any]) -> zmq.Socket[Any]:
    """A plain (not asyncio) socket over the same libzmq socket as ``socket``: its calls are
    direct C calls, with none of the asyncio socket's futures, for ``receive_queued``."""
    return zmq.Socket.shadow(socket.underlying)


def receive_queued(socket: zmq.Socket[Any], limit: int) -> list[list[bytes]]:
    """Up to ``limit`` messages already queued on ``socket`` (a ``plain_view``), without waiting."""
    out: list[list[bytes]] = []
    try:
        for _ in range(limit):
            out.append(recv_frames(socket))
    except zmq.Again:
        pass
    return out


_NOBLOCK = int(zmq.NOBLOCK)


def recv_frames(socket: zmq.Socket[Any]) -> list[bytes]:
    """The frames of the message queued on ``socket`` (``recv_multipart(NOBLOCK, copy=True)``);
    ``zmq.Again`` when none is. A frame says itself whether more follow, so this asks the socket
    nothing else: half the cost of pyzmq's ``recv_multipart`` on a 3-frame message (2 us, not 4),
    which looks up ``RCVMORE`` (an enum) on the socket after each frame."""
    recv = socket.recv
    frame = recv(_NOBLOCK, copy=False)
    frames = [frame.bytes]
    while frame.more:
        frame = recv(_NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


def configure(socket: SocketT, *, hwm: int = 0) -> SocketT:
    """Linger 0 (closing never hangs), the given high-water marks (0 = unbounded), IPv6 on (it
    connects to IPv4 and IPv6 endpoints alike), and with plane keys the CurveZMQ client keys
    (``bind`` turns a listening socket into a server)."""
    socket.setsockopt(zmq.LINGER, 0)
    socket.ipv6 = True
    socket.setsockopt(zmq.SNDHWM, hwm)
    socket.setsockopt(zmq.RCVHWM, hwm)
    keys = _keys
    if keys is not None:
        socket.curve_secretkey = keys.client_secret
        socket.curve_publickey = keys.client_public
        socket.curve_serverkey = keys.server_public
    return socket


def plain(socket: SocketT) -> SocketT:
    """Undo the client keys of ``configure``: for a peer that is not a dyn socket (the worker's
    own engine's KV-event publisher), which speaks plain ZMQ."""
    if _keys is not None:
        socket.curve_server = False  # also resets the mechanism to NULL
    return socket


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, or ``localhost``) names this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def is_local_endpoint(endpoint: str) -> bool:
    """Whether only this host can connect to ``endpoint``: ``ipc://`` (a Unix socket) or
    ``tcp://`` on a loopback address."""
    if endpoint.startswith("ipc://"):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint.removeprefix("tcp://").rpartition(":")[0]
    return is_loopback(host)


def bind(socket: zmq.Socket, host: str, port: int = 0) -> str:
    """Listen on ``host:port`` (0: a free port) and return the endpoint peers connect to:
    ``tcp://ADVERTISED:port`` (``advertised_host(host)``; see the module docstring).

    With plane keys the socket becomes a CurveZMQ server first. Without them, ``PlaneKeyError``
    for a ``host`` beyond loopback: nothing would stop another machine from connecting.
    ``zmq.ZMQError`` when the address cannot be bound.
    """
    keys = _keys
    if keys is None:
        if not is_loopback(host):
            raise PlaneKeyError(
                f"refusing to listen on {host}: without --plane-keys the ZMQ planes are not "
                "authenticated, so only a loopback address (127.0.0.1) is allowed. Make keys with "
                "'dyn keys DIR' and pass --plane-keys DIR to every dyn process. (--host is the ZMQ "
                "address in every dyn command; vLLM's --host, the HTTP server's, is --http-host)"
            )
    else:
        if keys.server_secret is None:
            raise PlaneKeyError(
                f"--plane-keys {keys.directory} has no {SERVER_KEY}{SECRET_SUFFIX}, "
                "which a process needs to listen; copy it from the directory "
                "'dyn keys' made"
            )
        socket.curve_secretkey = keys.server_secret
        socket.curve_publickey = keys.server_public
        socket.curve_server = True
        socket.zap_domain = ZAP_DOMAIN.encode()
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    address = host.strip("[]")
    socket.ipv6 = ":" in address  # an IPv4 host stays an IPv4 socket, not a v4-mapped one
    if port:
        socket.bind(tcp_endpoint(address, port))
    else:
        port = socket.bind_to_random_port(tcp_endpoint(address, 0).removesuffix(":0"))
    return tcp_endpoint(advertised_host(host), port)


def bind_random(socket: zmq.Socket, host: str) -> str:
    """Bind ``socket`` to a free TCP port on ``host`` and return its advertised endpoint (see
    ``bind``)."""
    return bind(socket, host, 0)


def tcp_endpoint(host: str, port: int) -> str:
    """``tcp://host:port``, an IPv6 host in brackets."""
    host = host.strip("[]")
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "*"})
"""Bind hosts that mean every interface (``*`` is ZMQ's spelling), never an address to connect to."""


def is_wildcard(host: str) -> bool:
    """Whether binding ``host`` listens on every interface (``0.0.0.0``, ``::``, ``*``)."""
    return host.strip("[]") in WILDCARD_HOSTS


class AdvertiseHostError(ConfigError):
    """``--advertise-host`` is not an address peers could connect to."""


_advertise_host: str | None = None


def use_advertise_host(host: str | None) -> str | None:
    """Advertise ``host`` for every socket this process binds from now on (None: the bind host,
    or ``primary_address`` for a wildcard). ``AdvertiseHostError`` for a wildcard or anything
    that is not a host name or address (a scheme, a port)."""
    global _advertise_host
    if host is not None:
        host = host.strip()
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not bare or is_wildcard(bare):
            raise AdvertiseHostError(
                f"--advertise-host {host or repr(host)} is not an address peers can connect to: "
                "give this host's address or name as the other hosts reach it (e.g. 10.0.0.5)"
            )
        if not _is_address(bare) and not _is_host_name(bare):
            raise AdvertiseHostError(
                f"--advertise-host {host!r} is not a host name or IP address "
                "(no scheme, no port: the port of each socket is its own)"
            )
        host = bare
    _advertise_host = host
    return host


def advertised_host(bind_host: str) -> str:
    """The host peers connect to for a socket bound on ``bind_host``: ``--advertise-host`` if
    the process set one, else ``bind_host`` itself unless it is a wildcard, else this host's
    primary address (of the wildcard's family)."""
    if _advertise_host is not None:
        return _advertise_host
    if is_wildcard(bind_host):
        return primary_address(ipv6=bind_host.strip("[]") == "::")
    return bind_host.strip("[]")


PROBE_ADDRESSES = {False: "192.0.2.1", True: "2001:db8::1"}
"""Where the primary-address probe "connects" (documentation ranges, RFC 5737 / RFC 3849): a
UDP connect only picks the route and source address; no packet is sent."""


@functools.cache
def primary_address(*, ipv6: bool = False) -> str:
    """This host's primary address: the source address the kernel picks for a UDP socket
    "connected" to a public address (no packet is sent). Without a route there is none: the
    loopback address, with a warning that peers on other hosts cannot connect."""
    family = _socket.AF_INET6 if ipv6 else _socket.AF_INET
    try:
        with _socket.socket(family, _socket.SOCK_DGRAM) as probe:
            probe.connect((PROBE_ADDRESSES[ipv6], 9))
            address = str(probe.getsockname()[0])
    except OSError as exc:
        loopback = "::1" if ipv6 else "127.0.0.1"
        log.warning(
            "binding every interface, but this host has no route to find its own address "
            "(%s); advertising %s, which peers on other hosts cannot reach: pass --advertise-host",
            exc.strerror or exc,
            loopback,
        )
        return loopback
    return address.split("%")[0]


def advertised_endpoint(endpoint: str, bind_host: str) -> str:
    """What peers connect to for ``endpoint``, bound by someone else (an engine's own KV-event
    publisher) for a process whose sockets bind ``bind_host``: a ``tcp://`` endpoint on a
    wildcard or on ``bind_host`` gets ``advertised_host(bind_host)``; any other endpoint (another
    concrete address, ``ipc://``) is left as it is."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    bound, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    bound = bound.strip("[]")
    if is_wildcard(bound) or bound == bind_host.strip("[]"):
        return f"{tcp_endpoint(advertised_host(bind_host), 0).removesuffix(':0')}:{port}"
    return endpoint


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
STATIC_PORTS_FROM = 20000
"""The lowest port ``free_ports`` hands out: above the well-known and most registered services."""
_FREE_PORT_TRIES = 200


def ephemeral_ports() -> range:
    """The ports the kernel gives to a bind at port 0 and to an outgoing connection (Linux's
    ``ip_local_port_range``; the IANA range 49152-65535 where it cannot be read)."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    return range(low, high + 1)


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` right now, for a socket another library
    binds moments later (vLLM's and SGLang's KV-event publishers, NIXL's side channel).

    The ports come from below the kernel's ephemeral range (``ephemeral_ports``), so nothing
    that binds port 0 or connects out meanwhile (the engine's own ZMQ and torch sockets, in the
    same moment) can be given one; each is checked free by binding it. Only another process
    choosing the same fixed port in that moment could take one; the library then reports an
    address in use. Where that range leaves no room, the kernel picks (port 0)."""
    address = host.strip("[]")
    address = "0.0.0.0" if address == "*" else address
    family = _socket.AF_INET6 if ":" in address else _socket.AF_INET
    static = range(STATIC_PORTS_FROM, min(ephemeral_ports().start, 65536))
    candidates = random.sample(static, min(len(static), _FREE_PORT_TRIES)) if len(static) >= 4 * count else []
    taken: list[_socket.socket] = []
    try:
        for port in [*candidates, *[0] * count]:
            if len(taken) == count:
                break
            sock = _socket.socket(family, _socket.SOCK_STREAM)
            try:
                sock.bind((address, port))
            except OSError:
                sock.close()
                if port == 0:
                    raise
                continue
            taken.append(sock)
        return [sock.getsockname()[1] for sock in taken]
    finally:
        for sock in taken:
            sock.close()


IPC_PATH_LIMIT = 100
"""Bytes a Unix socket path may have (``sun_path`` holds 108 on Linux, 104 on macOS)."""
_private_dir: Path | None = None
_private_names = itertools.count()


def private_endpoint(name: str) -> str:
    """``ipc://DIR/NAME-N`` (a new ``N`` per call): a Unix socket in a directory only this user
    may enter, for a socket another library binds that only this worker should reach (its
    engine's KV-event publisher under plane keys, ``dyn.core.worker.kv_relay``). The directory is
    made (0700) on the first call, under the temporary directory (``/tmp`` where that path would
    be too long for a socket), and removed when this process exits."""
    global _private_dir
    if _private_dir is None or not _private_dir.is_dir():
        base = tempfile.gettempdir()
        if len(base) > IPC_PATH_LIMIT - 40:
            base = "/tmp"
        _private_dir = Path(tempfile.mkdtemp(prefix="dyn-private-", dir=base))
        atexit.register(_remove_private_dir, _private_dir, os.getpid())
    path = _private_dir / f"{name}-{next(_private_names)}"
    if len(str(path).encode()) > IPC_PATH_LIMIT:
        raise PlaneKeyError(f"{path} is too long for a Unix socket; set TMPDIR to a shorter directory")
    return f"ipc://{path}"


def _remove_private_dir(path: Path, owner: int) -> None:
    if os.getpid() == owner:  # not in a forked child that exits while its parent runs on
        shutil.rmtree(path, ignore_errors=True)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_host_name(host: str) -> bool:
    """A DNS name (RFC 1123 labels)."""
    labels = host.rstrip(".").split(".")
    return len(host) <= 253 and all(
        0 < len(label) <= 63
        and label[0] != "-"
        and label[-1] != "-"
        and all(c.isalnum() or c == "-" for c in label)
        and label.isascii()
        for label in labels
    )
