"""Settings an operator gets wrong, as a fresh user found them (each once accepted silently or
refused with a misleading message): every one now loads as written in the README or is refused
with exit 2 and a message that names the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from linkguard.cli import main
from linkguard.config import AgentSettings, BusSettings, ConfigError, ServiceSettings, load_settings


def _yaml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cfg.yaml"
    p.write_text(text)
    return p


def test_an_empty_broker_list_is_refused_not_the_default_broker(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="brokers is empty"):
        load_settings(ServiceSettings, _yaml(tmp_path, "bus: {brokers: []}\n"))
    assert BusSettings().broker_addresses() == [("127.0.0.1", 1883)]  # left out: host/port


def test_subscribe_qos_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_BUS__SUBSCRIBE_QOS", "0")
    assert load_settings(AgentSettings).bus.subscribe_qos == 0
    monkeypatch.setenv("LINKGUARD_BUS__SUBSCRIBE_QOS", "2")
    with pytest.raises(ConfigError, match="subscribe_qos"):
        load_settings(AgentSettings)


def test_verbs_events_off_unquoted_in_yaml(tmp_path: Path) -> None:
    s = load_settings(AgentSettings, _yaml(tmp_path, "verbs_events: off\n"))
    assert s.verbs_events == "off"


def test_a_misspelt_counter_threshold_is_refused(tmp_path: Path) -> None:
    cfg = _yaml(
        tmp_path, "counter_health: {thresholds: {symbol_eror: {degrade: 100, clear: 10}}}\n"
    )
    with pytest.raises(
        ConfigError, match=r"unknown counter\(s\) symbol_eror; known: .*symbol_error"
    ):
        load_settings(AgentSettings, cfg)


def test_never_route_around_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_OFFLINE__ROUTE_AROUND_AFTER_S", "null")
    assert load_settings(ServiceSettings).offline.route_around_after_s is None
    monkeypatch.setenv("LINKGUARD_OFFLINE__ROUTE_AROUND_AFTER_S", "12.5")
    assert load_settings(ServiceSettings).offline.route_around_after_s == 12.5


def test_a_hook_given_as_a_shell_string_says_so(tmp_path: Path) -> None:
    cfg = _yaml(tmp_path, "hooks: [{name: drain, argv: 'scontrol update NodeName=x'}]\n")
    with pytest.raises(ConfigError, match="not a shell string"):
        load_settings(AgentSettings, cfg)


def test_nccl_env_with_a_bad_api_url_is_bad_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nccl", "env", "--host", "gpu000", "--api", "nonsense"]) == 2
    assert "give an http:// or https:// URL" in capsys.readouterr().err


def test_a_key_given_twice_in_the_config_is_refused(tmp_path: Path) -> None:
    cfg = _yaml(tmp_path, "bus: {brokers: ['n1:1883']}\nhost: a\nbus: {port: 1884}\n")
    with pytest.raises(ConfigError, match="key 'bus' given twice"):
        load_settings(ServiceSettings, cfg)


def test_probe_settings_over_the_per_port_bound_are_refused_at_load(tmp_path: Path) -> None:
    cfg = _yaml(tmp_path, "probes: {enabled: true, fan_out: 16, rate_pps: 16}\n")
    with pytest.raises(ConfigError, match=r"256 probes/s per port > 16"):
        load_settings(ServiceSettings, cfg)
    with pytest.raises(ConfigError, match="cross_su 5 > fan_out 2"):
        load_settings(AgentSettings, _yaml(tmp_path, "probes: {cross_su: 5, fan_out: 2}\n"))


async def test_a_probe_responder_can_be_rebound_at_once() -> None:
    """An epoch rotation closes every rail's responder and binds the same address again."""
    from linkguard.agent.probe import ProbeResponder
    from linkguard.broker import free_port

    port = free_port()
    for _ in range(3):
        async with ProbeResponder("127.0.0.1", port) as r:
            assert r._proto is not None and r._proto.transport is not None
