"""One parser for an advantage spec, whichever adapter reads it (REWARDD_ADVANTAGE, verl's
``advantage`` key, the TRL hook's argument): an estimator name or a spec, as JSON or a mapping."""

from __future__ import annotations

import pytest

from rewardd_client._rewards import AdapterConfigError, parse_advantage
from rewardd_client.trl import rewardd_advantages
from rewardd_client.verl_settings import DEFAULT_ADVANTAGE, settings_from
from tests.support.trl_standin import StandInTrainer, single_process_accelerate


@pytest.mark.parametrize("value, expected", [
    ("grpo", {"estimator": "grpo", "profile": "verl"}),
    ("  rloo\n", {"estimator": "rloo", "profile": "verl"}),
    ('{"estimator": "rloo"}', {"estimator": "rloo"}),  # a spec is taken as written
    ({"estimator": "opo", "profile": "rewardd"}, {"estimator": "opo", "profile": "rewardd"}),
])
def test_every_form_an_adapter_accepts(value, expected) -> None:
    assert parse_advantage(value, "verl") == expected


@pytest.mark.parametrize("value, words", [
    ("{not json", ["REWARDD_ADVANTAGE", "not valid JSON"]),
    ("grpo rloo", ["REWARDD_ADVANTAGE", "neither an estimator name", "JSON"]),
    ("", ["REWARDD_ADVANTAGE", "neither"]),
    ([1], ["REWARDD_ADVANTAGE", "list"]),
])
def test_what_is_neither_name_nor_spec_is_refused_by_name(value, words) -> None:
    with pytest.raises(AdapterConfigError) as caught:
        parse_advantage(value, "verl", "REWARDD_ADVANTAGE")
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_verl_takes_a_bare_estimator_name_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("REWARDD_ADVANTAGE", "grpo")
    assert settings_from({"base_url": "http://x:1"}).advantage == DEFAULT_ADVANTAGE
    monkeypatch.setenv("REWARDD_ADVANTAGE", "rloo")
    assert settings_from({"base_url": "http://x:1"}).advantage == {"estimator": "rloo",
                                                                   "profile": "verl"}


def test_verl_config_key_wins_over_the_environment_in_any_form(monkeypatch) -> None:
    monkeypatch.setenv("REWARDD_ADVANTAGE", "rloo")
    section = {"base_url": "http://x:1", "advantage": "passk"}
    assert settings_from(section).advantage == {"estimator": "passk", "profile": "verl"}
    with pytest.raises(AdapterConfigError, match="advantage: 'pass k' is neither"):
        settings_from({**section, "advantage": "pass k"})


def test_the_trl_hook_reads_the_same_forms(monkeypatch) -> None:
    single_process_accelerate(monkeypatch)

    def hooked_spec(advantage) -> dict:
        trainer = rewardd_advantages(StandInTrainer([], num_generations=2), "http://unused",
                                     advantage, validate=False)
        return trainer._calculate_rewards.__self__.advantage

    assert hooked_spec("tempo") == {"estimator": "tempo", "profile": "trl"}
    assert hooked_spec('{"estimator": "tempo", "params": {"beta": 1}}') == {
        "estimator": "tempo", "params": {"beta": 1}}
    with pytest.raises(AdapterConfigError, match="advantage: 'tem po' is neither"):
        hooked_spec("tem po")
