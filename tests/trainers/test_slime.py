"""rewardd_client.slime: slime's group reward call, replayed, against a real server.

slime does not install from PyPI (the ``slime`` there is an unrelated project), so
scripts/slime_group_rm.py replays its exact call: the function loaded from
``--custom-rm-path`` by dotted path and awaited as ``function(args, samples)`` on a
``Sample``-shaped group, in the OpenRLHF/slime trainer environment (rewardd-client installed
as a user installs it). The request builder is checked without a server too (in make test).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from rewardd_client.slime import build_request
from tests.trainers.conftest import SCRIPTS, run_script, trainer_python

MATH = [{"name": "math", "verifier": "math"}]


def sample(response: str, status: str = "completed", **fields):
    base = {"group_index": 3, "index": 0, "prompt": "What is 2+2?", "tokens": [7, 8, 9, 10, 11],
            "response": response, "response_length": 2, "label": "4"}
    return {**base, **fields, "status": status}


def as_object(fields: dict) -> SimpleNamespace:
    return SimpleNamespace(**{**fields, "status": SimpleNamespace(value=fields["status"])})


def test_a_group_is_one_request_and_aborted_samples_are_not_sent():
    samples = [as_object(sample("\\boxed{4}")), as_object(sample("", status="aborted")),
               as_object(sample("cut \\boxed{", status="truncated", response_length=4))]
    body, scored = build_request(samples, MATH, evaluation=True)
    assert scored == [0, 2]
    assert body == {"rewards": MATH, "evaluation": True, "groups": [{
        "group_id": "3", "prompt": "What is 2+2?", "reference": {"answer": "4"},
        "rollouts": [
            {"rollout_id": "0", "completion": "\\boxed{4}", "num_tokens": 2,
             "token_ids": [10, 11]},
            {"rollout_id": "2", "completion": "cut \\boxed{", "num_tokens": 4,
             "token_ids": [8, 9, 10, 11]}]}]}


def test_a_chat_prompt_is_sent_as_role_lines_and_an_all_aborted_group_sends_nothing():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    body, _ = build_request([as_object(sample("4", prompt=chat, label=None))], MATH)
    assert body["groups"][0]["prompt"] == "system: Be brief.\nuser: 2+2?"
    assert body["groups"][0]["reference"] == {}
    assert build_request([as_object(sample("", status="aborted"))], MATH) == (None, [])


def run_slime(case: dict, tmp_path: Path, env: dict[str, str] | None = None) -> list:
    case_path, out_path = tmp_path / "case.json", tmp_path / "out.json"
    case_path.write_text(json.dumps(case))
    run_script(trainer_python("REWARDD_OPENRLHF_PYTHON", "test-openrlhf-slime"),
               [str(SCRIPTS / "slime_group_rm.py"), str(case_path), str(out_path)], env=env)
    return json.loads(out_path.read_text())


@pytest.mark.trainers
def test_slime_flags_alone_score_a_group_with_the_rm_url(rewardd_url, tmp_path):
    """No user code: --custom-rm-path rewardd_client.slime.group_reward --group-rm
    --rm-url URL, and REWARDD_REWARDS=math in the environment."""
    case = {"args": {"custom_rm_path": "rewardd_client.slime.group_reward",
                     "rm_url": rewardd_url},
            "samples": [sample("so \\boxed{4}"), sample("\\boxed{5}"),
                        sample("2+2 is", status="truncated"), sample("", status="aborted"),
                        sample("\\boxed{4}", status="failed")]}
    assert run_slime(case, tmp_path, env={"REWARDD_REWARDS": "math"}) == [1.0, 0.0, 0.0, None,
                                                                           1.0]


@pytest.mark.trainers
def test_a_users_two_line_module_with_reward_key_trains_on_one_component(rewardd_url, tmp_path):
    module = tmp_path / "my_rm.py"  # the user's own two lines
    module.write_text(
        "from rewardd_client.slime import reward_function\n"
        f"reward = reward_function({rewardd_url!r}, '[{{\"name\": \"math\", \"verifier\": "
        "\"math\"}, {\"name\": \"half\", \"verifier\": \"math\", \"weight\": 0.5}]')\n")
    chat = [{"role": "user", "content": "What is 2+2?"}]
    case = {"args": {"custom_rm_path": "my_rm.reward", "reward_key": "reward"},
            "python_path": str(tmp_path),
            "kwargs": {"evaluation": True},
            "samples": [sample("\\boxed{4}", prompt=chat), sample("\\boxed{3}", prompt=chat)]}
    assert run_slime(case, tmp_path) == [1.5, 0.0]
    case["args"]["reward_key"] = "half"
    assert run_slime(case, tmp_path) == [1.0, 0.0]


@pytest.mark.trainers
def test_a_failed_cell_without_fallback_stops_the_group_with_the_reason(rewardd_url, tmp_path):
    case = {"args": {"custom_rm_path": "rewardd_client.slime.group_reward",
                     "rm_url": rewardd_url},
            "samples": [sample("\\boxed{4}", label="\\frac{")]}
    with pytest.raises(pytest.fail.Exception, match="RewardFailed.*invalid_reference"):
        run_slime(case, tmp_path, env={"REWARDD_REWARDS": "math"})


def test_no_server_configured_names_the_settings(monkeypatch):
    import asyncio

    from rewardd_client._rewards import AdapterConfigError
    from rewardd_client.slime import reward_function

    monkeypatch.delenv("REWARDD_URL", raising=False)
    with pytest.raises(AdapterConfigError, match="pass base_url or set REWARDD_URL"):
        asyncio.run(reward_function(rewards="math")(SimpleNamespace(rm_url=None),
                                                    [as_object(sample("4"))]))
