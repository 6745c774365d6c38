"""The mocker engine's flags, shared by ``dyn worker mocker`` and ``dyn bench replay --offline``.

``@mocker_flags`` puts every flag ``MockerConfig`` declares (``dyn.plugins.mocker.config``) in place
of the command's ``mocker_config`` parameter and hands the command one validated ``MockerConfig``.
A bad value or combination exits with status 2 and a sentence naming the flag (``--replies`` is
read then, so a bad file is reported before anything starts).
"""

from __future__ import annotations

from dyn.cli.config_flags import config_flags
from dyn.plugins.mocker.config import MockerConfig

mocker_flags = config_flags("mocker_config", MockerConfig)
