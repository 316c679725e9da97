"""Settings an operator gets wrong, as a fresh user found them (each once accepted silently or
refused with a misleading message): every one now loads as written in docs/ (once the README)
or is refused with exit 2 and a message that names the fix."""

from __future__ import annotations

import re
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
    s = load_settings(AgentSettings, _yaml(tmp_path, "verbs: {events: off}\n"))
    assert s.verbs.events == "off"


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


def test_a_complex_key_in_the_config_is_refused(tmp_path: Path) -> None:
    """YAML's explicit key (``? rails: 2``) makes a mapping a key: refused with the line, not
    a TypeError (the config fuzz target's find, CI 2026-12-07)."""
    cfg = _yaml(tmp_path, "generate:\n  hosts: 4\n?  rails: 2\nsolve:\n  short_ms: 50.0\n")
    with pytest.raises(ConfigError, match="a key must be a plain name, not a mapping or list"):
        load_settings(ServiceSettings, cfg)
    cfg = _yaml(tmp_path, "? [a, b]\n: 1\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_settings(AgentSettings, cfg)


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


# -- verbs.events: the YAML file and the environment take the same words -------------------------


@pytest.mark.parametrize(
    ("word", "value"),
    [
        ("auto", "auto"),
        ("on", "auto"),
        ("On", "auto"),
        ("true", "auto"),
        ("yes", "auto"),
        ("off", "off"),
        ("OFF", "off"),
        ("false", "off"),
        ("no", "off"),
    ],
)
def test_verbs_events_means_the_same_in_yaml_and_env(
    word: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """YAML 1.1 reads a bare on/off/yes/no as a bool, the environment gives the word."""
    from_yaml = load_settings(AgentSettings, _yaml(tmp_path, f"verbs:\n  events: {word}\n"))
    monkeypatch.setenv("LINKGUARD_VERBS__EVENTS", word)
    from_env = load_settings(AgentSettings)
    assert from_yaml.verbs.events == from_env.verbs.events == value


@pytest.mark.parametrize("word", ["1", "maybe", "'on '"])
def test_verbs_events_refuses_the_same_words_in_yaml_and_env(
    word: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = r"verbs.events: .*expected auto or off \(on, true, yes mean auto"
    if word != "'on '":  # a quoted 'on ' with its space is a plain word in YAML
        with pytest.raises(ConfigError, match=message):
            load_settings(AgentSettings, _yaml(tmp_path, f"verbs:\n  events: {word}\n"))
        monkeypatch.setenv("LINKGUARD_VERBS__EVENTS", word)
        with pytest.raises(ConfigError, match=message):
            load_settings(AgentSettings)
    else:  # surrounding spaces are not a different word, in either
        assert (
            load_settings(
                AgentSettings, _yaml(tmp_path, f"verbs:\n  events: {word}\n")
            ).verbs.events
            == "auto"
        )
        monkeypatch.setenv("LINKGUARD_VERBS__EVENTS", "on ")
        assert load_settings(AgentSettings).verbs.events == "auto"


# -- counter_health thresholds: degrade alone, clear alone -----------------------------------------


def _threshold(tmp_path: Path, counter: str, override: str) -> tuple[int, int]:
    cfg = _yaml(tmp_path, f"counter_health: {{thresholds: {{{counter}: {override}}}}}\n")
    t = load_settings(AgentSettings, cfg).counter_health.thresholds[counter]
    return t.degrade, t.clear


@pytest.mark.parametrize(
    ("counter", "override", "expected"),
    [
        ("symbol_error", "{degrade: 50}", (50, 10)),  # the default clear (10) is below 50
        ("symbol_error", "{degrade: 1000}", (1000, 10)),
        ("symbol_error", "{degrade: 10}", (10, 1)),  # default clear 10 is not below: 10 // 10
        ("symbol_error", "{degrade: 5}", (5, 0)),
        ("link_downed", "{degrade: 6}", (6, 0)),
        ("symbol_error", "{clear: 50}", (100, 50)),  # the default degrade
        ("link_error_recovery", "{clear: 2}", (3, 2)),
        ("symbol_error", "{degrade: 40, clear: 20}", (40, 20)),
    ],
)
def test_a_threshold_override_may_give_one_of_degrade_and_clear(
    counter: str, override: str, expected: tuple[int, int], tmp_path: Path
) -> None:
    assert _threshold(tmp_path, counter, override) == expected
    others = load_settings(
        AgentSettings,
        _yaml(tmp_path, f"counter_health: {{thresholds: {{{counter}: {override}}}}}\n"),
    ).counter_health.thresholds
    assert others["port_rcv_errors"].degrade == 100 and others["port_rcv_errors"].clear == 10


@pytest.mark.parametrize(
    ("counter", "override", "message"),
    [
        (
            "symbol_error",
            "{clear: 100}",
            r"thresholds\.symbol_error: clear \(100\) must be below degrade \(100, the default "
            r"degrade\)",
        ),
        (
            "link_downed",
            "{degrade: 4, clear: 4}",
            r"thresholds\.link_downed: clear \(4\) must be below degrade \(4\)",
        ),
        ("rx_crc_errors_phy", "{}", r"thresholds\.rx_crc_errors_phy: give degrade, clear or both"),
        ("symbol_error", "{degrade: 0}", r"thresholds\.symbol_error\.degrade: .*greater than"),
    ],
)
def test_a_bad_threshold_override_names_the_counter(
    counter: str, override: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=message):
        _threshold(tmp_path, counter, override)


def test_a_degrade_alone_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__SYMBOL_ERROR__DEGRADE", "50")
    t = load_settings(AgentSettings).counter_health.thresholds["symbol_error"]
    assert (t.degrade, t.clear) == (50, 10)
    monkeypatch.delenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__SYMBOL_ERROR__DEGRADE")
    monkeypatch.setenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__SYMBOL_ERROR__CLEAR", "100")
    with pytest.raises(ConfigError, match=r"symbol_error: clear \(100\) must be below degrade"):
        load_settings(AgentSettings)


def _readings(policy: object, values: list[int]) -> bool:
    """Whether a port reading ``symbol_error`` = ``values``, one a second, ends degraded (the
    first two readings are 0: baselines)."""
    from linkguard.agent.health import CounterHealth

    h = CounterHealth(policy)  # type: ignore[arg-type]
    verdict = None
    for t, v in enumerate([0, 0, *values]):
        verdict = h.observe("mlx5_0/1", {"symbol_error": v}, frozenset(), usable=True, now=t)
    assert verdict is not None
    return verdict.degraded


def test_a_degrade_alone_drains_at_that_count() -> None:
    from linkguard.agent.health import CounterHealthPolicy

    policy = CounterHealthPolicy(thresholds={"symbol_error": {"degrade": 50}})
    assert not _readings(policy, [49])
    assert _readings(policy, [49, 50])


def test_counter_health_enabled_false_never_drains(tmp_path: Path) -> None:
    assert AgentSettings().counter_health.enabled is True  # the default
    assert _readings(AgentSettings().counter_health, [10_000])
    s = load_settings(AgentSettings, _yaml(tmp_path, "counter_health: {enabled: false}\n"))
    assert not _readings(s.counter_health, [10_000])


# -- LINKGUARD_* variables this role does not read ---------------------------------------------


def test_the_other_roles_variables_are_logged_and_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from structlog.testing import capture_logs

    monkeypatch.setenv("LINKGUARD_LEDGER__PATH", "/var/lib/linkguard/ledger.sqlite")
    monkeypatch.setenv("LINKGUARD_SOLVE__SHORT_MS", "50")
    with capture_logs() as logs:
        s = load_settings(AgentSettings)
    assert s.host  # it started
    assert logs == [
        {
            "event": "env_setting_of_other_role",
            "log_level": "info",
            "role": "agent",
            # conftest.py sets LINKGUARD_API__ENABLED for every test: a service setting too
            "variables": [
                "LINKGUARD_API__ENABLED",
                "LINKGUARD_LEDGER__PATH",
                "LINKGUARD_SOLVE__SHORT_MS",
            ],
            "note": "settings of the service; ignored by the agent",
        }
    ]
    monkeypatch.setenv("LINKGUARD_POLL_INTERVAL_MS", "50")
    monkeypatch.setenv("LINKGUARD_COUNTER_HEALTH__WINDOW_S", "30")
    with capture_logs() as logs:
        load_settings(ServiceSettings)
    assert [(e["event"], e["role"], e["variables"]) for e in logs] == [
        (
            "env_setting_of_other_role",
            "service",
            ["LINKGUARD_COUNTER_HEALTH__WINDOW_S", "LINKGUARD_POLL_INTERVAL_MS"],
        )
    ]


def test_a_name_in_the_other_roles_section_that_no_role_has_is_a_warning_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent warns and starts (the environment may be shared); the service, whose section
    it is, refuses it."""
    from structlog.testing import capture_logs

    monkeypatch.delenv("LINKGUARD_API__ENABLED")
    monkeypatch.setenv("LINKGUARD_LEDGER__PAHT", "/x")
    monkeypatch.setenv("LINKGUARD_API__PROT", "1")
    with capture_logs() as logs:
        load_settings(AgentSettings)
    assert logs == [
        {
            "event": "unknown_env_setting",
            "log_level": "warning",
            "role": "agent",
            "variables": ["LINKGUARD_API__PROT", "LINKGUARD_LEDGER__PAHT"],
            "note": "named no setting of the agent or the service; ignored",
        }
    ]
    with pytest.raises(ConfigError, match="LINKGUARD_API__PROT, LINKGUARD_LEDGER__PAHT"):
        load_settings(ServiceSettings)


def test_a_typo_in_a_section_of_this_role_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LINKGUARD_BUS__PROT", "1884")
    for cls in (AgentSettings, ServiceSettings):
        with pytest.raises(ConfigError, match=r"unknown setting\(s\) .*LINKGUARD_BUS__PROT"):
            load_settings(cls)


def test_test_switches_and_hook_variables_are_not_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every non-setting LINKGUARD_ variable of the repository (CI, tests, hooks) loads
    silently; dict keys and optional sections deeper down are settings."""
    from structlog.testing import capture_logs

    monkeypatch.delenv("LINKGUARD_API__ENABLED")
    from linkguard.config import _NOT_SETTINGS

    assert {"LINKGUARD_REQUIRE_REAL", "LINKGUARD_HOOK", "LINKGUARD_ARTIFACTS"} <= _NOT_SETTINGS
    for name in _NOT_SETTINGS:
        monkeypatch.setenv(name, "1")
    with capture_logs() as logs:
        load_settings(AgentSettings)
        monkeypatch.setenv("LINKGUARD_LEADER__ETCD__TTL_S", "5")
        monkeypatch.setenv("LINKGUARD_LEADER__ETCD__ENDPOINTS", '["etcd1:2379"]')
        assert load_settings(ServiceSettings).leader.etcd.ttl_s == 5  # type: ignore[union-attr]
    assert [e for e in logs if e["event"] != "env_setting_of_other_role"] == []


def test_before_logging_is_configured_the_events_go_to_stderr_in_the_settings_format(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI loads the settings before configure_logging; stdout may carry a command's
    output (``linkguard nccl env``)."""
    import json

    monkeypatch.setenv("LINKGUARD_LEDGER__PAHT", "/x")
    load_settings(AgentSettings)
    out, err = capsys.readouterr()
    assert out == ""
    events = [json.loads(line) for line in err.splitlines()]
    assert [(e["event"], e["level"], e["variables"]) for e in events] == [
        ("unknown_env_setting", "warning", ["LINKGUARD_LEDGER__PAHT"]),
        ("env_setting_of_other_role", "info", ["LINKGUARD_API__ENABLED"]),
    ]
    monkeypatch.setenv("LINKGUARD_LOG_LEVEL", "warning")
    load_settings(AgentSettings)
    assert [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()] == [
        "unknown_env_setting"
    ]


# -- settings that passed their own bounds but switched a feature off -----------------------------


@pytest.mark.parametrize(
    ("probes", "message"),
    [
        (
            "{min_samples: 50}",
            "probes: min_samples 50 > window_s 10 x rate_pps 1 = 10 probes a pair gets per "
            "report window",
        ),
        ("{min_samples: 3, window_s: 1, rate_pps: 2}", "min_samples 3 > window_s 1 x rate_pps 2"),
        ("{min_probers: 5}", "probes: min_probers 5 > fan_out 4"),
        ("{min_probers: 3, fan_out: 2, cross_su: 1}", "min_probers 3 > fan_out 2"),
        ("{timeout_s: 20, min_samples: 5}", "probes: timeout_s 20 > window_s 10"),
        ("{window_s: 600, epoch_s: 300}", "probes: window_s 600 > epoch_s 300"),
    ],
)
def test_probe_settings_that_switch_localisation_off_are_refused(
    probes: str, message: str, tmp_path: Path
) -> None:
    for cls in (ServiceSettings, AgentSettings):
        with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
            load_settings(cls, _yaml(tmp_path, f"probes: {probes}\n"))


def test_probe_settings_at_their_bounds_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "probes: {min_samples: 10, min_probers: 4, timeout_s: 10, window_s: 10, epoch_s: 10}\n"
    p = load_settings(ServiceSettings, _yaml(tmp_path, text)).probes
    assert (p.min_samples, p.min_probers, p.timeout_s, p.window_s, p.epoch_s) == (
        10,
        4,
        10.0,
        10.0,
        10.0,
    )
    monkeypatch.setenv("LINKGUARD_PROBES__MIN_PROBERS", "5")  # the environment: the same check
    with pytest.raises(ConfigError, match="min_probers 5 > fan_out 4"):
        load_settings(ServiceSettings)


def test_the_probe_port_follows_the_mode_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ServiceSettings().probes.port == 47_910
    assert (
        load_settings(ServiceSettings, _yaml(tmp_path, "probes: {mode: roce}\n")).probes.port
        == 4791
    )
    given = load_settings(ServiceSettings, _yaml(tmp_path, "probes: {mode: roce, port: 47911}\n"))
    assert (given.probes.mode, given.probes.port) == ("roce", 47_911)
    udp = load_settings(ServiceSettings, _yaml(tmp_path, "probes: {mode: udp}\n"))
    assert udp.probes.port == 47_910
    monkeypatch.setenv("LINKGUARD_PROBES__MODE", "roce")
    assert load_settings(ServiceSettings).probes.port == 4791


def test_a_counter_window_shorter_than_five_readings_is_refused(tmp_path: Path) -> None:
    from linkguard.agent.health import CounterHealthPolicy

    with pytest.raises(ConfigError, match=r"counter_health\.window_s: 0\.5 s is too short"):
        load_settings(AgentSettings, _yaml(tmp_path, "counter_health: {window_s: 0.5}\n"))
    with pytest.raises(ConfigError, match="give window_s >= 5"):
        load_settings(AgentSettings, _yaml(tmp_path, "counter_health: {window_s: 4.9}\n"))
    s = load_settings(AgentSettings, _yaml(tmp_path, "counter_health: {window_s: 5}\n"))
    assert s.counter_health.window_s == 5.0
    # a 5 s window sees the once-a-second readings: 60 errors within it drain the port
    policy = CounterHealthPolicy(window_s=5, thresholds={"symbol_error": {"degrade": 50}})
    assert _readings(policy, [60])
    assert not _readings(policy, [30])


@pytest.mark.parametrize("value", ["true", "false", "50.5", "'x'"])
def test_a_threshold_that_is_not_a_whole_number_is_refused_from_yaml_and_env(
    value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _yaml(
        tmp_path, f"counter_health: {{thresholds: {{symbol_error: {{degrade: {value}}}}}}}\n"
    )
    where = r"counter_health\.thresholds\.symbol_error\.degrade: must be a whole number"
    with pytest.raises(ConfigError, match=where):
        load_settings(AgentSettings, cfg)
    monkeypatch.setenv(
        "LINKGUARD_COUNTER_HEALTH__THRESHOLDS__SYMBOL_ERROR__DEGRADE", value.strip("'")
    )
    with pytest.raises(ConfigError, match=where):
        load_settings(AgentSettings)


def test_a_whole_threshold_still_loads_from_yaml_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _yaml(tmp_path, "counter_health: {thresholds: {link_downed: {degrade: 1, clear: 0}}}\n")
    t = load_settings(AgentSettings, cfg).counter_health.thresholds["link_downed"]
    assert (t.degrade, t.clear) == (1, 0)
    monkeypatch.setenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__LINK_DOWNED__DEGRADE", "3")
    monkeypatch.setenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__LINK_DOWNED__CLEAR", "1")
    t = load_settings(AgentSettings).counter_health.thresholds["link_downed"]
    assert (t.degrade, t.clear) == (3, 1)


@pytest.mark.parametrize(
    ("cls", "yaml_text", "env", "field"),
    [
        (AgentSettings, "poll_interval_ms: .nan", "POLL_INTERVAL_MS", "poll_interval_ms"),
        (
            AgentSettings,
            "counter_health: {window_s: .nan}",
            "COUNTER_HEALTH__WINDOW_S",
            "counter_health.window_s",
        ),
        (
            AgentSettings,
            "counter_health: {clear_after_s: .inf}",
            "COUNTER_HEALTH__CLEAR_AFTER_S",
            "counter_health.clear_after_s",
        ),
        (ServiceSettings, "solve: {short_ms: -.inf}", "SOLVE__SHORT_MS", "solve.short_ms"),
        (ServiceSettings, "probes: {rate_pps: .nan}", "PROBES__RATE_PPS", "probes.rate_pps"),
        (
            ServiceSettings,
            "offline: {max_fraction: .nan}",
            "OFFLINE__MAX_FRACTION",
            "offline.max_fraction",
        ),
        (
            ServiceSettings,
            "ledger: {retention_days: .inf}",
            "LEDGER__RETENTION_DAYS",
            "ledger.retention_days",
        ),
    ],
)
def test_non_finite_numbers_say_so_not_a_bound(
    cls: type, yaml_text: str, env: str, field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = re.escape(field) + ": must be a finite number"
    with pytest.raises(ConfigError, match=message):
        load_settings(cls, _yaml(tmp_path, yaml_text + "\n"))
    monkeypatch.setenv(f"LINKGUARD_{env}", "nan")
    with pytest.raises(ConfigError, match=message):
        load_settings(cls)


@pytest.mark.parametrize(
    ("text", "field", "message"),
    [
        ("probes: {min_samples: true}\n", "probes.min_samples", "must be a number, not true"),
        ("probes: {fan_out: 4.0}\n", "probes.fan_out", "must be a whole number, not 4.0"),
        (
            "ports: [{hca: mlx5_0, expected_rate_gbps: true}]\n",
            "ports.0.expected_rate_gbps",
            "must be a number, not true",
        ),
        (
            "damping: {hold_down_initial_s: false}\n",
            "damping.hold_down_initial_s",
            "must be a number, not false",
        ),
        (
            "counter_health: {window_s: yes}\n",
            "counter_health.window_s",
            "must be a number, not true",
        ),
        ("poll_interval_ms: true\n", "poll_interval_ms", "must be a number, not true"),
    ],
)
def test_a_yaml_boolean_or_a_float_is_no_whole_number(
    tmp_path: Path, text: str, field: str, message: str
) -> None:
    """pydantic's lax mode read YAML true as 1 (min_samples 1: every pair counts after one
    probe) and 4.0 as 4; counter thresholds already refused both, now every number does."""
    with pytest.raises(ConfigError) as err:
        load_settings(AgentSettings, _yaml(tmp_path, text))
    assert f"{field}: {message}" in str(err.value), str(err.value)


def test_numbers_from_the_environment_still_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINKGUARD_PROBES__FAN_OUT", "3")
    monkeypatch.setenv("LINKGUARD_DAMPING__HOLD_DOWN_INITIAL_S", "5")
    monkeypatch.setenv("LINKGUARD_POLL_INTERVAL_MS", "250.5")
    s = load_settings(AgentSettings)
    assert (s.probes.fan_out, s.damping.hold_down_initial_s, s.poll_interval_ms) == (3, 5.0, 250.5)
    monkeypatch.setenv("LINKGUARD_PROBES__FAN_OUT", "true")
    with pytest.raises(ConfigError, match=r"probes\.fan_out"):
        load_settings(AgentSettings)


@pytest.mark.parametrize(
    ("cls", "text", "message"),
    [
        (
            AgentSettings,
            "counter_health: {thresholds: {symbol_error: {degrad: 5}}}\n",
            "counter_health: thresholds.symbol_error: unknown key(s) degrad; give degrade, "
            "clear or both",
        ),
        (
            AgentSettings,
            "counter_health: false\n",
            "counter_health: a section, not a switch: write {enabled: false}, not false",
        ),
        (
            ServiceSettings,
            "probes: true\n",
            "probes: a section, not a switch: write {enabled: true}, not true",
        ),
        (
            AgentSettings,
            "probes: {clear_after_s: 0}\n",
            "probes: clear_after_s 0 < window_s 10: a verdict would clear before one whole "
            "window of answered probes",
        ),
        (
            AgentSettings,
            "ports: [{hca: mlx5_0, expected_rate_gbps: 3000}]\n",
            "ports.0.expected_rate_gbps: 3000 Gb/s is above any port's rate (2400 Gb/s, 12X XDR)",
        ),
        (
            AgentSettings,
            "ports: [{hca: mlx5_0, expected_rate_gbps: 401}]\n",
            "ports.0.expected_rate_gbps: 401 Gb/s is no rate a port reports (a width "
            "1X/2X/4X/8X/12X times a lane rate SDR 2.5 ... XDR 200 Gb/s); nearest: 400 or 300",
        ),
    ],
)
def test_settings_mistakes_are_named_with_the_fix(
    tmp_path: Path, cls: type, text: str, message: str
) -> None:
    """The first fresh-eyes pass of issue 8 met these: a misspelt threshold key reported as
    a missing one, a bare false for a section, a clear_after_s of 0 taken (a verdict cleared
    at the first clean window), an expected rate no port reports (drained for good)."""
    with pytest.raises(ConfigError) as err:
        load_settings(cls, _yaml(tmp_path, text))
    assert message in str(err.value), str(err.value)


def test_a_negative_degrade_alone_is_the_one_error(tmp_path: Path) -> None:
    """``degrade: -5`` alone: clear filled in from the default, so only degrade is named."""
    with pytest.raises(ConfigError) as err:
        load_settings(
            AgentSettings,
            _yaml(tmp_path, "counter_health: {thresholds: {symbol_error: {degrade: -5}}}\n"),
        )
    text = str(err.value)
    assert (
        "counter_health.thresholds.symbol_error.degrade: Input should be greater than or " in text
    )
    assert ".clear" not in text


def test_env_misspelt_threshold_key_and_fractional_whole_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__SYMBOL_ERROR__DEGRAD", "5")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) degrad"):
        load_settings(AgentSettings)
    monkeypatch.delenv("LINKGUARD_COUNTER_HEALTH__THRESHOLDS__SYMBOL_ERROR__DEGRAD")
    monkeypatch.setenv("LINKGUARD_PROBES__FAN_OUT", "4.0")  # YAML 4.0 is refused: so is this
    with pytest.raises(ConfigError, match=r"probes\.fan_out: must be a whole number, not '4\.0'"):
        load_settings(AgentSettings)
    monkeypatch.setenv("LINKGUARD_PROBES__FAN_OUT", " 4 ")
    assert load_settings(AgentSettings).probes.fan_out == 4
    monkeypatch.setenv("LINKGUARD_PORTS", '[{"hca": "mlx5_0", "expected_rate_gbps": 800}]')
    assert load_settings(AgentSettings).ports[0].expected_rate_gbps == 800.0


def test_routes_section_defaults_bounds_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = load_settings(AgentSettings, _yaml(tmp_path, "{}\n"))
    assert (s.routes.source, s.routes.rto_min_ms, s.routes.neighbour_flush) == (
        "endpoint",
        None,
        True,
    )
    s = load_settings(AgentSettings, _yaml(tmp_path, "routes: {rto_min_ms: 20, source: kernel}\n"))
    assert (s.routes.source, s.routes.rto_min_ms) == ("kernel", 20)
    for bad, says in [
        ("routes: {rto_min_ms: 0}", "greater than or equal to 1"),
        ("routes: {rto_min_ms: 20.5}", "whole number"),
        ("routes: {rto_min_ms: true}", "must be a number, not true"),
        ("routes: {source: rail}", "'endpoint' or 'kernel'"),
        ("routes: {rto_min: 20}", "rto_min"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(says)):
            load_settings(AgentSettings, _yaml(tmp_path, bad + "\n"))
    monkeypatch.setenv("LINKGUARD_ROUTES__RTO_MIN_MS", "25")
    assert load_settings(AgentSettings).routes.rto_min_ms == 25
