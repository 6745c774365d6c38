"""The supervisor of ``--num-http-workers`` says at start what keeps a killed worker's queued
connections (``net.ipv4.tcp_migrate_req``), only where it is not set."""

from __future__ import annotations

from dyn.core.frontend.http_workers import _migration_hint


def test_the_hint_names_the_setting_only_when_it_is_off(tmp_path):
    setting = tmp_path / "tcp_migrate_req"
    setting.write_text("0\n")
    assert "sysctl -w net.ipv4.tcp_migrate_req=1" in _migration_hint(setting)
    setting.write_text("1\n")
    assert _migration_hint(setting) is None
    assert _migration_hint(tmp_path / "absent") is None  # a kernel before 5.14
