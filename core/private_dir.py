"""Directories that must be private to their user: the discovery root, the plane keys."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dyn.core.errors import ConfigError


def check_private_dir(path: Path, what: str, fix: str) -> os.stat_result:
    """``stat`` of ``path`` if it is a directory owned by this user that no other user may
    write to, else ``ConfigError`` naming ``what`` and saying how to ``fix`` it. A symlink
    counts only if the link itself is ours too (nobody else can re-point it)."""
    try:
        link = os.lstat(path)
        info = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}; {fix}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {path} is not a directory; {fix}")
    uid = os.geteuid()
    if info.st_uid != uid or link.st_uid != uid:
        owner = info.st_uid if info.st_uid != uid else link.st_uid
        raise ConfigError(f"{what} {path} belongs to user id {owner}, not to you (user id {uid}); {fix}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            f"{what} {path} is writable by other users (mode {stat.S_IMODE(info.st_mode):o}); {fix}"
        )
    return info
