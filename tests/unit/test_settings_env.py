"""Settings fail fast: unknown REWARDD_* names and bad values are refused, one line each."""

from __future__ import annotations

import pytest

from rewardd.service.environment import (ConfigError, known_variables, load_settings,
                                         unknown_variables)
from rewardd.service.settings import Settings


def test_a_misspelled_variable_is_named_with_the_nearest_setting() -> None:
    lines = unknown_variables({"REWARDD_POOL_SIZ": "4", "REWARDD_PORT": "9000", "HOME": "/"})
    assert len(lines) == 1
    assert lines[0].startswith("REWARDD_POOL_SIZ: not a rewardd setting; did you mean "
                               "REWARDD_POOL_SIZE?")
    assert "REWARDD_ALLOW_UNKNOWN" in lines[0]


def test_a_name_far_from_every_setting_gets_no_guess() -> None:
    [line] = unknown_variables({"REWARDD_ZZZQQQXX": "1"})
    assert "did you mean" not in line and line.startswith("REWARDD_ZZZQQQXX:")


def test_deliberate_extras_pass_by_name_or_all_at_once() -> None:
    env = {"REWARDD_MY_WRAPPER": "1", "REWARDD_OTHER": "2"}
    assert len(unknown_variables(env)) == 2
    assert unknown_variables({**env, "REWARDD_ALLOW_UNKNOWN": "REWARDD_MY_WRAPPER"}) == [
        unknown_variables({"REWARDD_OTHER": "2"})[0]]
    assert unknown_variables({**env, "REWARDD_ALLOW_UNKNOWN": "1"}) == []


def test_every_setting_and_the_client_variables_are_known() -> None:
    known = known_variables()
    for name in Settings.model_fields:
        assert f"REWARDD_{name.upper()}" in known or name == "prometheus_multiproc_dir"
    assert {"REWARDD_PROMETHEUS_MULTIPROC_DIR", "REWARDD_URL", "REWARDD_REWARDS",
            "REWARDD_JUDGE_BASE_URL", "REWARDD_MODEL_ROOTS", "REWARDD_SANDBOX_UNSAFE",
            "REWARDD_ALLOW_UNKNOWN"} <= known
    assert unknown_variables({name: "" for name in known}) == []


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.upper().startswith("REWARDD_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_log_level_out_of_its_set_is_one_clear_line(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARDD_LOG_LEVEL", "verbose")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.lines == ["REWARDD_LOG_LEVEL=verbose: must be one of debug, info, "
                                  "warning, error or critical"]
    clean_env.setenv("REWARDD_LOG_LEVEL", "WARNING")
    assert load_settings().log_level == "warning"


def test_every_bad_variable_is_reported_at_once(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARDD_SANDBOX_MAX_TIME_S", "300")
    clean_env.setenv("REWARDD_JUDGE_ALLOW_REQUEST_URLS", "maybe")
    clean_env.setenv("REWARDD_POOL_SIZ", "3")
    clean_env.setenv("REWARDD_METRICS_TOKEN", "")  # valid; a secret's value is never shown
    with pytest.raises(ConfigError) as caught:
        load_settings()
    lines = caught.value.lines
    assert len(lines) == 3
    assert lines[0].startswith("REWARDD_POOL_SIZ: not a rewardd setting")
    assert ("REWARDD_JUDGE_ALLOW_REQUEST_URLS=maybe: input should be a valid boolean, "
            "unable to interpret input") in lines
    assert ("REWARDD_SANDBOX_MAX_TIME_S=300: input should be less than or equal to 120"
            in lines)


def test_a_secret_value_is_not_echoed(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARDD_RETRY_AFTER_S", "0")
    clean_env.setenv("REWARDD_JUDGE_CACHE_TTL_S", "-1")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "REWARDD_JUDGE_CACHE_TTL_S=-1: input should be greater than 0" in caught.value.lines
    from rewardd.service.environment import shown

    assert shown("REWARDD_JUDGE_API_KEY", "sk-123") == "<hidden>"


def test_a_default_timeout_above_its_maximum_is_refused_not_clamped(
        clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARDD_VERIFIER_TIMEOUT_S", "300")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.lines == ["REWARDD_VERIFIER_TIMEOUT_S=300 is above "
                                  "REWARDD_MAX_VERIFIER_TIMEOUT_S=120: raise the maximum or "
                                  "lower the default"]
    clean_env.setenv("REWARDD_MAX_VERIFIER_TIMEOUT_S", "300")
    assert load_settings().verifier_timeout_s == 300


def test_judge_and_sandbox_settings_join_the_one_object(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARDD_JUDGE_BASE_URL", "http://judge:8000/v1")
    clean_env.setenv("REWARDD_MODEL_ROOTS", "/models")
    clean_env.setenv("REWARDD_SANDBOX_UNSAFE", "1")
    settings = load_settings()
    assert (settings.judge_base_url, settings.model_roots, settings.sandbox_unsafe) == (
        "http://judge:8000/v1", "/models", True)
    from rewardd.verifiers.judge.config import configured_backends

    assert configured_backends()["default"]["base_url"] == "http://judge:8000/v1"
