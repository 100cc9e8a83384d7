"""REWARDD_COMPAT_CONFIG is checked when the settings load and when the app is built: a file
or inline JSON, and every bad field named with its reason (rewardd serve refuses to start on
it)."""

from __future__ import annotations

import json

import pytest
from rewardd.service.compat.config import (CompatConfig, CompatConfigInvalid,
                                           load_compat_config, validated_compat_config)
from rewardd.service.settings import Settings


def refused(source: str) -> str:
    with pytest.raises(CompatConfigInvalid) as info:
        validated_compat_config(Settings(compat_config=source))
    return str(info.value)


@pytest.mark.parametrize("config, words", [
    ({"rewards": [{"name": "x", "verifier": "nope"}]}, "rewards.0.verifier: unknown verifier"),
    ({"rewards": [{"name": "r", "verifier": "regex", "params": {}}]},
     "rewards.0.params.pattern: Field required"),
    ({"rewards": []}, "rewards: List should have at least 1 item"),
    ({"group": {"size": 4, "advantage": {"estimator": "no_such"}}},
     "group.advantage.estimator"),
    ({"group": {"size": 0}}, "group.size: Input should be greater than or equal to 1"),
    ({"group": {"size": 4, "timeout_s": 600}}, "group.timeout_s"),
    ({"openrlhf": {"value": "advantage"}},
     "openrlhf.value is `advantage` but group.advantage is not set"),
    ({"slime": {"path": "/verify"}}, "slime.path '/verify' is another route"),
    ({"slime": {"reward_key": "a b"}}, "slime.reward_key"),
    ({"lable_format": "json"}, "lable_format: Extra inputs are not permitted"),
])
def test_a_bad_field_is_refused_naming_it(config, words):
    assert words in refused(json.dumps(config))


def test_a_missing_file_and_bad_json_or_yaml_are_refused_naming_the_source(tmp_path):
    assert "cannot read file" in refused(str(tmp_path / "absent.json"))
    assert "inline JSON): not valid JSON" in refused("{oops")
    bad = tmp_path / "compat.yaml"
    bad.write_text("rewards: [unclosed\n")
    assert "not valid YAML" in refused(str(bad))
    listed = tmp_path / "compat.json"
    listed.write_text("[1]")
    assert "expected an object, got list" in refused(str(listed))


def test_a_yaml_file_gives_the_same_config_as_inline_json(tmp_path):
    path = tmp_path / "compat.yml"
    path.write_text("rewards:\n  - {name: ok, verifier: exact_match}\n"
                    "group: {size: 4, advantage: {estimator: rloo}}\n"
                    "slime: {reward_key: acc, value: advantage}\n")
    inline = json.dumps({"rewards": [{"name": "ok", "verifier": "exact_match"}],
                         "group": {"size": 4, "advantage": {"estimator": "rloo"}},
                         "slime": {"reward_key": "acc", "value": "advantage"}})
    assert load_compat_config(str(path)) == load_compat_config(inline)
    config = Settings(compat_config=str(path))
    assert config.compat_config == str(path)
    loaded = load_compat_config(str(path))
    assert loaded.group.advantage.output == "scalar"  # one number per sample, forced


def test_the_defaults_are_math_with_a_flagged_fallback_and_no_groups():
    config = CompatConfig()
    assert [(s.name, s.verifier, s.fallback) for s in config.rewards] == [
        ("correct", "math", 0.0)]
    assert config.reference == {"answer": "{label}"} and config.group is None
    assert (config.slime.path, config.slime.reward_key) == ("/slime/reward", "reward")
    assert config.nemo_gym.label_field == "expected_answer"


def test_rewardd_serve_refuses_to_start_on_a_bad_config_naming_the_field():
    import subprocess
    import sys

    from tests.support.server import REPO_ROOT, child_env

    env = {**child_env(), "REWARDD_COMPAT_CONFIG": '{"group": {"size": -1}}'}
    proc = subprocess.run([sys.executable, "-m", "rewardd.service.cli", "serve", "--port", "0"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "REWARDD_COMPAT_CONFIG" in proc.stderr and "group.size" in proc.stderr


@pytest.mark.parametrize("path", ["/v1/score", "/v1/advantages", "/v1", "/v1/", "//v1//jobs",
                                  "/v1/sessions/x/rollouts", "/healthz", "/redoc", "/get_reward"])
def test_a_slime_path_that_shadows_a_route_of_rewardd_is_refused(path):
    """Issue 28 row 16: ``slime.path=/v1/score`` was accepted; the app's own route answered
    every slime call, so slime was silently unreachable."""
    assert f"slime.path {path!r} is another route of rewardd" in refused(
        json.dumps({"slime": {"path": path}}))


@pytest.mark.parametrize("path", ["/slime/reward", "/v1x/score", "/rm/v1/score"])
def test_a_slime_path_of_its_own_is_accepted(path):
    assert validated_compat_config(
        Settings(compat_config=json.dumps({"slime": {"path": path}}))).slime.path == path


def test_every_route_of_the_app_is_reserved_from_slime():
    """The reserved list cannot drift from the routes: every path the app serves (but the
    slime route itself, whose path is the setting) is refused as slime.path."""
    from rewardd.service.app import create_app
    from rewardd.service.compat.config import is_reserved

    paths: set[str] = set()

    def walk(routes) -> None:
        for route in routes:
            if hasattr(route, "original_router"):  # an included router
                walk(route.original_router.routes)
            elif getattr(route, "path", None):
                paths.add(route.path)

    walk(create_app().router.routes)
    paths.discard(CompatConfig().slime.path)
    assert {"/v1/score", "/healthz", "/get_reward", "/verify"} <= paths
    assert all(is_reserved(p) for p in paths), sorted(p for p in paths if not is_reserved(p))
