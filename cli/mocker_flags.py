"""The mocker engine's flags, shared by ``dyn worker mocker`` and ``dyn bench replay --offline``.

``@mocker_flags`` puts every flag ``MockerConfig`` declares (``dyn.plugins.mocker.config``) in place
of the command's ``mocker_config`` parameter and hands the command one validated ``MockerConfig``.
A bad value or combination exits with status 2 and a sentence naming the flag (``--replies`` is
read then, so a bad file is reported before anything starts).

``@mocker_flags_beside_router`` is the same for a command that also has the KV router's flags
(``dyn bench replay``): the flags both configs declare (the ``--aic-*`` setup of ``--timing-model
aic`` and ``--router-prefill-load-model ais``) are the router's, offered once; the mocker reads
their values. It goes above ``@router_flags``.
"""

from __future__ import annotations

from dyn.cli.config_flags import config_flags, flag_table
from dyn.core.router.config import KvRouterConfig
from dyn.plugins.mocker.config import MockerConfig

mocker_flags = config_flags("mocker_config", MockerConfig)

ROUTER_DECLARED = tuple(name for name in flag_table(MockerConfig) if name in flag_table(KvRouterConfig))
"""The parameters of the flags ``MockerConfig`` shares with ``KvRouterConfig``."""

mocker_flags_beside_router = config_flags("mocker_config", MockerConfig, reads=ROUTER_DECLARED)
