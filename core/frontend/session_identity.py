"""The agent session a request belongs to, from the headers coding agents send.

One id per request, the first of ``SESSION_HEADERS`` present: Dynamo's ``x-dynamo-session-id``,
Claude Code's ``x-claude-code-session-id``, Codex's ``session-id`` (and ``session_id``), OpenCode's
``x-session-id`` and ``x-session-affinity`` (aiperf sends the latter too). The
Responses API's ``prompt_cache_key`` names one too when no header does
(``dyn.core.frontend.apis.responses``). ``PARENT_HEADERS`` name the agent that spawned this one
(a subagent's parent): it is logged with the request, and with ``--router-parent-affinity`` its
worker places the subagent's first request (``dyn.core.router.agent``).

The frontend's ``--router-session-affinity`` (``SessionAffinity``) decides what the id does: with
``soft`` (the default) or ``hard`` the session is bound to the worker of its first turn and later
turns go there (``dyn.core.router.agent``); ``off`` ignores it. ``nvext.session_control`` in the
body takes precedence over a header. An id must be 1 to ``MAX_ID_CHARS`` visible ASCII characters
(a 400 naming the header otherwise); the bindings are capped and expire
(``dyn.core.router.sessions``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dyn.core.protocol.errors import bad_request

if TYPE_CHECKING:
    from dyn.core.protocol.openai import NvExt

SESSION_HEADERS = (
    b"x-dynamo-session-id",
    b"x-claude-code-session-id",
    b"session-id",
    b"session_id",
    b"x-session-id",
    b"x-session-affinity",
)
PARENT_HEADERS = (
    b"x-dynamo-parent-session-id",
    b"x-claude-code-parent-agent-id",
    b"x-codex-parent-thread-id",
    b"x-parent-session-id",
)
"""The agent that spawned this one, the first of these present: Dynamo's, Claude Code's (a
nested subagent's immediate parent), Codex's, and the generic one Dynamo also reads."""
MAX_ID_CHARS = 256
"""Dynamo's bound on a session id (``MAX_SESSION_AFFINITY_ID_BYTES``)."""
_ID = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_ID_CHARS)

AffinityMode = Literal["off", "soft", "hard"]
AFFINITY_MODES: tuple[AffinityMode, ...] = ("off", "soft", "hard")


@dataclass(frozen=True, slots=True)
class SessionAffinity:
    """``--router-session-affinity`` and ``--router-session-affinity-ttl-secs``."""

    mode: AffinityMode = "soft"
    ttl_s: int = 300
    """How long a session stays bound after its last turn (a sliding window)."""


def session_ids(headers: dict[bytes, bytes]) -> tuple[str | None, str | None]:
    """``(session id, parent session id)`` named by the request's headers (None: none)."""
    session = None
    for name in SESSION_HEADERS:
        value = headers.get(name)
        if value is not None:
            session = checked(value, name.decode())
            break
    for name in PARENT_HEADERS:
        value = headers.get(name)
        if value is not None:
            return session, checked(value, name.decode())
    return session, None


def checked(value: bytes | str, where: str) -> str:
    """A session id as sent, or a 400 naming ``where`` when it is not 1 to 256 visible ASCII
    characters."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    if not _ID.fullmatch(text):
        raise bad_request(
            f"{where} must be 1 to {MAX_ID_CHARS} visible ASCII characters (no spaces or control "
            f"characters), got {text[:80]!r}",
            param=where,
        )
    return text


def agent_ids(
    nvext: NvExt | None, session_id: str | None, parent_id: str | None
) -> tuple[str | None, str | None]:
    """``(the agent a request belongs to, the agent that spawned it)``: ``nvext.agent_context``'s
    ``program_id`` and ``parent_program_id``, else the session the client named (its headers,
    ``session_id``, else ``nvext.session_control``) and its parent header (``parent_id``)."""
    agent = nvext.agent_context if nvext is not None else None
    control = nvext.session_control if nvext is not None else None
    own = agent.program_id if agent is not None else session_id or (control.session_id if control else None)
    parent = agent.parent_program_id if agent is not None and agent.parent_program_id else parent_id
    return own, parent
