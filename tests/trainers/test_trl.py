"""rewardd_client.trl against TRL's real GRPOTrainer (``make test-trl``) and a real server.

Two kinds of test, all against the session's real ``rewardd serve``:

- the adapter called exactly as trl 1.16's ``GRPOTrainer._calculate_rewards`` calls a reward
  function (keyword lists, ``trainer_state``, ``log_metric``), from this environment, where
  rewardd-client is installed too: exact rewards, None for failed cells, one request per
  batch, chat messages, split groups;
- TRL itself (``.venv-trl``): the tiny random Qwen2 of ``scripts/trl_model.py`` trained for 2
  steps by ``scripts/trl_grpo.py`` on 2 processes (torchrun, gloo on CPU) with groups split
  across them. The script records what TRL did; the tests recompute it through the server.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import httpx
import pytest

from rewardd_client._trl_advantages import advantages_request, component_names, dense
from rewardd_client.trl import (NotInCatalogue, TRLInputError, async_reward_function,
                                async_reward_functions, completion_text, prompt_text,
                                reward_function, reward_functions, rewardd_advantages)
from tests.support.server import REPO_ROOT, child_env
from tests.support.trl_standin import Batch as StandIn
from tests.support.trl_standin import StandInTrainer, rows_of, single_process_accelerate
from tests.trainers.conftest import SCRIPTS, run_script, trainer_python

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(900)]

MATH_AND_LENGTH = [{"name": "math", "verifier": "math"},
                   {"name": "length", "verifier": "length",
                    "params": {"unit": "tokens", "max_length": 6, "buffer": 4}}]
"""The reward spec of the training script (scripts/trl_grpo.py REWARDS)."""


def served(url: str, route: str) -> float:
    """Requests the server answered on ``route`` so far (any status), from /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    pattern = re.compile(r'^rewardd_http_requests_total\{([^}]*)\} (\S+)$', re.M)
    return sum(float(value) for labels, value in pattern.findall(text)
               if f'route="{route}"' in labels)


def trl_call(function: Any, prompts: list, completions: list, ids: list[list[int]],
             **columns: Any) -> Any:
    """Call ``function`` with the keywords TRL 1.16 passes (trainer_state, log_extra and
    log_metric beside the dataset columns)."""
    return function(prompts=prompts, completions=completions, completion_ids=ids,
                    trainer_state=SimpleNamespace(global_step=3), log_extra=lambda *a: None,
                    log_metric=columns.pop("log_metric", lambda *a: None), **columns)


# ---- the adapter as TRL calls it ---------------------------------------------------------

def test_weighted_reward_per_completion_and_none_for_a_failed_cell(rewardd_url: str) -> None:
    specs = [{"name": "math", "verifier": "math", "weight": 2.0},
             {"name": "length", "verifier": "length", "params": {"max_length": 3, "buffer": 2}}]
    function = reward_function(rewardd_url, specs)
    # groups split as on a second process: the last two of one group, then one of four
    values = trl_call(function, ["p0"] * 2 + ["p1"] * 4, ["3", "1 3", "4", "x", "5", "4"],
                      [[1], [1, 2, 3], [4], [5, 5], [1], [2]], answer=["3"] * 2 + [""] * 4)
    assert values == [2.0, -1.0, None, None, None, None]
    assert function.__name__ == "rewardd"


def test_each_group_gets_the_reference_of_its_own_rows(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, "exact_match")
    values = trl_call(function, ["q"] * 4 + ["r"] * 2, ["a", "b", "a", "b", "a", "b"],
                      [[1]] * 6, answer=["a"] * 4 + ["b"] * 2)
    assert values == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert function.__name__ == "exact_match"


def test_equal_prompts_with_different_answers_are_different_groups(rewardd_url: str) -> None:
    values = trl_call(reward_function(rewardd_url, "exact_match"), ["q"] * 4,
                      ["a", "a", "b", "b"], [[1]] * 4, answer=["a", "a", "b", "b"])
    assert values == [1.0, 1.0, 1.0, 1.0]


def test_num_tokens_are_the_completion_ids_lengths(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, {"name": "len", "verifier": "length",
                                             "params": {"max_length": 4, "buffer": 3}},
                               reference_column=None)
    # the text has one word each; the token counts differ: 1, 2, 3, 4 tokens
    values = trl_call(function, ["p"] * 4, ["w"] * 4, [[7] * n for n in (1, 2, 3, 4)])
    assert values == [0.0, -1 / 3, -2 / 3, -1.0]


def test_reference_fn_builds_any_reference_from_the_row(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, "exact_match",
                               reference_fn=lambda row: {"answers": row["solutions"]})
    values = trl_call(function, ["p", "p"], ["x", "z"], [[1], [1]],
                      solutions=[["x", "y"], ["x", "y"]])
    assert values == [1.0, 0.0]


def test_reference_fn_sees_the_prompt_and_every_column(rewardd_url: str) -> None:
    rows: list[dict] = []
    function = reward_function(rewardd_url, "exact_match",
                               reference_fn=lambda row: rows.append(dict(row)) or {"answer": "x"})
    trl_call(function, ["p"], ["x"], [[1]], answer=["x"], level=[2])
    assert rows == [{"prompt": "p", "answer": "x", "level": 2}]


def test_a_missing_reference_column_names_it_and_the_columns_trl_passed(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, "exact_match", reference_column="solution")
    with pytest.raises(TRLInputError) as caught:
        trl_call(function, ["p"], ["x"], [[1]], answer=["x"], level=[1])
    assert caught.value.field == "solution"
    assert "['answer', 'level']" in caught.value.reason


def test_reference_fn_returning_no_dict_is_refused(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, "exact_match", reference_fn=lambda row: "x")
    with pytest.raises(TRLInputError) as caught:
        trl_call(function, ["p"], ["x"], [[1]])
    assert caught.value.field == "reference_fn"
    assert "returned str" in caught.value.reason


def test_a_reward_spec_without_a_name_is_refused() -> None:
    with pytest.raises(TRLInputError) as caught:
        reward_function("http://127.0.0.1:1", [{"verifier": "math"}])
    assert caught.value.field == "rewards[0]"


def test_no_reference_column_sends_an_empty_reference(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, {"name": "has_digit", "verifier": "regex",
                                             "params": {"pattern": r"\d"}},
                               reference_column=None)
    assert trl_call(function, ["p", "p"], ["a1", "b"], [[1], [1]]) == [1.0, 0.0]


def test_chat_messages_become_text() -> None:
    chat = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "2+2?"}]}]
    completion = [{"role": "assistant", "content": "let me call"},
                  {"role": "tool", "content": "4"},
                  {"role": "assistant", "content": "4"}]
    assert prompt_text(chat) == "system: be brief\nuser: 2+2?"
    assert completion_text(completion) == "let me call\n4"
    assert prompt_text("plain") == "plain" and completion_text("plain") == "plain"


def test_chat_completions_are_judged_on_the_assistant_content(rewardd_url: str) -> None:
    prompt = [{"role": "user", "content": "2+2?"}]
    completions = [[{"role": "assistant", "content": "4"}],
                   [{"role": "assistant", "content": "5"}]]
    function = reward_function(rewardd_url, "exact_match")
    assert trl_call(function, [prompt, prompt], completions, [[1], [1]],
                    answer=["4", "4"]) == [1.0, 0.0]


def test_component_functions_share_one_request_per_batch(rewardd_url: str) -> None:
    specs = [{"name": "math", "verifier": "math", "weight": 0.5}, *MATH_AND_LENGTH[1:]]
    functions = reward_functions(rewardd_url, specs)
    metrics: list[tuple[str, float]] = []
    batch = dict(prompts=["p"] * 3, completions=["3", "1 2 4", "x"],
                 ids=[[1], [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]], answer=["3", "3", ""])
    before = served(rewardd_url, "/v1/rewards")
    values = [trl_call(f, batch["prompts"], batch["completions"], batch["ids"],
                       answer=batch["answer"], log_metric=lambda *m: metrics.append(m))
              for f in functions]
    assert served(rewardd_url, "/v1/rewards") - before == 1
    assert [f.__name__ for f in functions] == ["math", "length"]
    assert [f.weight for f in functions] == [0.5, 1.0]
    # the last row's answer differs: a group of its own, whose empty answer fails math
    assert values == [[1.0, 0.0, None], [0.0, -0.75, -1.0]]
    assert metrics == [("rewardd/failed_cells", 1.0)]  # once per batch, not per member


def test_a_member_called_again_means_a_new_batch(rewardd_url: str) -> None:
    functions = reward_functions(rewardd_url, MATH_AND_LENGTH)
    before = served(rewardd_url, "/v1/rewards")
    for _ in range(2):  # two steps with identical batches: each step sends its own request
        for f in functions:
            trl_call(f, ["p"], ["3"], [[1]], answer=["3"])
    assert served(rewardd_url, "/v1/rewards") - before == 2


def test_failed_cells_are_logged_through_trl_log_metric(rewardd_url: str) -> None:
    metrics: list[tuple[str, float]] = []
    values = trl_call(reward_function(rewardd_url, MATH_AND_LENGTH), ["p", "q"], ["1", "2"],
                      [[1], [1]], answer=["1", ""], log_metric=lambda *m: metrics.append(m))
    assert values == [1.0, None]
    assert metrics == [("rewardd/failed_cells", 1.0)]


def test_the_sentinels_signals_are_logged_through_trl_log_metric(rewardd_url: str) -> None:
    """With a run_id, each batch's answer carries the server sentinel's view of the run (a
    step behind: the record is written after the answer), logged as rewardd/sentinel/*."""
    function = reward_function(rewardd_url, MATH_AND_LENGTH, run_id="trl-sentinel")
    logged: list[tuple[str, float]] = []
    for _ in range(50):  # a guard: the first batches may answer before one was recorded
        logged.clear()
        trl_call(function, ["p"], ["3"], [[1]], answer=["3"],
                 log_metric=lambda *m: logged.append(m))
        if len(logged) > 1:
            break
    assert logged[0] == ("rewardd/failed_cells", 0.0)
    assert sorted(logged[1:]) == sorted(
        (f"rewardd/sentinel/{signal}", 0.0) for signal in (
            "audit_divergence", "length_gaming", "component_dominance", "repeated_answer",
            "hedging", "lenient_fallback"))


def test_async_component_functions_gathered_send_one_request(rewardd_url: str) -> None:
    functions = async_reward_functions(rewardd_url, MATH_AND_LENGTH)

    async def gathered() -> list[Any]:
        return await asyncio.gather(*[
            trl_call(f, ["p", "p"], ["3", "4"], [[1], [1, 2, 3]], answer=["3", "3"])
            for f in functions])

    before = served(rewardd_url, "/v1/rewards")
    assert asyncio.run(gathered()) == [[1.0, 0.0], [0.0, -0.25]]
    assert served(rewardd_url, "/v1/rewards") - before == 1


def test_async_reward_function_returns_what_the_sync_one_does(rewardd_url: str) -> None:
    args = (["p"] * 2, ["3", "x"], [[1], [1, 2, 3, 4]])
    sync = trl_call(reward_function(rewardd_url, MATH_AND_LENGTH), *args, answer=["3", "3"])
    asynchronous = asyncio.run(trl_call(async_reward_function(rewardd_url, MATH_AND_LENGTH),
                                        *args, answer=["3", "3"]))
    assert sync == asynchronous == [1.0, -0.5]


def test_trainer_step_and_run_id_go_with_the_batch(rewardd_url: str) -> None:
    function = reward_function(rewardd_url, "exact_match", run_id="run-7")
    body = function._batch.body(["p"], ["x"], [[1]], {
        "answer": ["x"], "trainer_state": SimpleNamespace(global_step=3),
        "log_metric": print, "log_extra": print})
    assert (body["run_id"], body["step"]) == ("run-7", 3)
    assert body["groups"] == [{"group_id": "g0", "prompt": "p", "reference": {"answer": "x"},
                               "rollouts": [{"rollout_id": "r0", "completion": "x",
                                             "num_tokens": 1}]}]


def test_reward_functions_survive_pickling_and_still_score(rewardd_url: str) -> None:
    functions = reward_functions(rewardd_url, MATH_AND_LENGTH)
    trl_call(functions[0], ["p"], ["3"], [[1]], answer=["3"])  # a client and an answer held
    copies = pickle.loads(pickle.dumps(functions))
    assert [trl_call(f, ["p"], ["3"], [[1]], answer=["3"]) for f in copies] == [[1.0], [0.0]]
    assert [f.__name__ for f in copies] == ["math", "length"]


def test_advantages_request_keeps_trl_none_convention() -> None:
    nan = math.nan
    rows = [([5, 6], [1, 1]), ([5], [1]), ([7, 8, 9], [1, 0, 1]), ([], [])]
    body = advantages_request(rows, [[1.0, nan], [nan, nan], [0.0, 0.5], [1.0, 2.0]],
                              ["math", "length"], [2.0, 1.0], 2, {"estimator": "tempo"}, "run1")
    first, second = body["groups"]
    assert [r["rewards"] for r in first["rollouts"]] == [{"math": 1.0, "length": 0.0},
                                                         {"math": None, "length": None}]
    assert second["rollouts"][0] == {"rollout_id": "r2", "token_ids": [7, 8, 9],
                                     "num_tokens": 3, "rewards": {"math": 0.0, "length": 0.5},
                                     "mask": [1, 0, 1]}
    assert body["advantage"] == {"profile": "trl", "estimator": "tempo", "output": "dense",
                                 "weights": {"math": 2.0, "length": 1.0}}
    assert body["run_id"] == "run1"
    with pytest.raises(ValueError, match="num_generations"):
        advantages_request(rows[:3], [[1.0]] * 3, ["r"], [1.0], 2, {}, None)


def test_trl_reward_names_become_distinct_component_names() -> None:
    assert component_names(["acc", "org/rm-7b", "acc", "a b"]) == ["acc", "org_rm-7b", "acc.2",
                                                                   "a_b"]


def test_dense_decodes_every_output_format() -> None:
    assert dense([0.5, -1.0], 2) == [0.5, -1.0]
    assert dense({"rle": [[0.5, 2], [0.0, 1]]}, 3) == [0.5, 0.5, 0.0]
    assert dense(0.25, 3) == [0.25, 0.25, 0.25]
    assert dense(None, 2) == [0.0, 0.0]


def test_rewardd_advantages_refuses_what_is_not_a_grpo_trainer() -> None:
    with pytest.raises(TypeError, match="_calculate_rewards"):
        rewardd_advantages(object(), "http://127.0.0.1:1")


# ---- the advantages hook's round trips, on a stand-in trainer (tests/support) -------------

ROUTES = ("/v1/rewards", "/v1/advantages", "/v1/score")
TEMPO = {"estimator": "tempo", "params": {"beta": 1.0}}
IDS = [[1, 2], [1, 2, 3, 4, 5, 6, 7, 8], [3], [3, 4, 5]]


def hooked_step(url: str, functions: list, advantage: Any, answers: list[str]
                ) -> tuple[list[list[float]], dict[str, float]]:
    """One step of a stand-in GRPOTrainer (2 groups of 2) hooked by rewardd_advantages: the
    advantages TRL would train on and the requests the server answered meanwhile."""
    trainer = rewardd_advantages(StandInTrainer(functions, num_generations=2), url, advantage)
    step = StandIn(prompts=["p0", "p0", "p1", "p1"], completions=["3", "4", "8", "x"],
                   completion_ids=IDS, answers=answers)
    before = {route: served(url, route) for route in ROUTES}
    advantages = rows_of(trainer.step(step), IDS)
    return advantages, {route: served(url, route) - before[route] for route in ROUTES
                        if served(url, route) - before[route]}


@pytest.mark.parametrize("advantage", [TEMPO, {"estimator": "grpo", "weights": {"length": 0.5}}],
                         ids=["tempo", "grpo-weighted"])
@pytest.mark.parametrize("answers, one_call", [
    (["3", "3", "8", "8"], {"/v1/score": 1}),
    (["3", "3", "", ""], {"/v1/score": 1, "/v1/advantages": 1}),  # math fails, length passes
], ids=["clean", "partly-failed"])
def test_one_score_request_gives_the_two_call_paths_advantages(rewardd_url, monkeypatch,
                                                              advantage, answers, one_call):
    single_process_accelerate(monkeypatch)
    together = reward_functions(rewardd_url, MATH_AND_LENGTH)  # made by one call: one request
    apart = [reward_functions(rewardd_url, [spec])[0] for spec in MATH_AND_LENGTH]
    fused, fused_requests = hooked_step(rewardd_url, together, advantage, answers)
    two_calls, two_call_requests = hooked_step(rewardd_url, apart, advantage, answers)
    assert fused_requests == one_call
    assert two_call_requests == {"/v1/rewards": 2, "/v1/advantages": 1}  # one per function
    assert fused == two_calls
    assert len({round(v, 6) for row in fused for v in row}) > 2


def test_an_unknown_verifier_or_estimator_fails_when_built(rewardd_url, monkeypatch) -> None:
    single_process_accelerate(monkeypatch)
    with pytest.raises(NotInCatalogue, match="'mathh' \\(did you mean 'math'\\?\\)"):
        reward_functions(rewardd_url, [{"name": "math", "verifier": "mathh"}])
    functions = reward_functions(rewardd_url, MATH_AND_LENGTH)
    with pytest.raises(NotInCatalogue, match="advantage.estimator: .* 'tempoo'"):
        rewardd_advantages(StandInTrainer(functions, num_generations=2), rewardd_url, "tempoo")


# ---- TRL's GRPOTrainer -------------------------------------------------------------------

@pytest.fixture(scope="module")
def trl_python() -> str:
    return trainer_python("REWARDD_TRL_PYTHON", "test-trl")


@pytest.fixture(scope="module")
def tiny_qwen2(trl_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    run_script(trl_python, [str(SCRIPTS / "trl_model.py"), str(path)], timeout_s=300)
    return path


def train(python: str, model: Path, url: str, out: Path, mode: str) -> dict[str, Any]:
    """Run scripts/trl_grpo.py on 2 processes; return what each recorded and the requests
    the server answered meanwhile."""
    routes = ("/v1/rewards", "/v1/advantages", "/v1/score")
    before = {route: served(url, route) for route in routes}
    run_script(python, ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(SCRIPTS / "trl_grpo.py"), "--model", str(model), "--url", url,
                        "--out", str(out), "--mode", mode], timeout_s=600)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {"ranks": ranks,
            "requests": {route: served(url, route) - before[route] for route in routes}}


@pytest.fixture(scope="module")
def trl_run(trl_python: str, tiny_qwen2: Path, rewardd_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return train(trl_python, tiny_qwen2, rewardd_url, tmp_path_factory.mktemp("trl"), "trl")


@pytest.fixture(scope="module")
def tempo_run(trl_python: str, tiny_qwen2: Path, rewardd_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return train(trl_python, tiny_qwen2, rewardd_url, tmp_path_factory.mktemp("tempo"), "tempo")


def steps(run: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(rank 0's batch, rank 1's batch) of each step."""
    yield from zip(run["ranks"][0]["batches"], run["ranks"][1]["batches"], strict=True)


def none_for_nan(values: list[float]) -> list[float | None]:
    return [None if math.isnan(v) else v for v in values]


def test_trl_trained_two_steps_on_two_processes_with_groups_split(trl_run: dict) -> None:
    assert [r["world_size"] for r in trl_run["ranks"]] == [2, 2]
    assert [len(list(steps(trl_run)))] == [2]
    for rank0, rank1 in steps(trl_run):
        assert rank0["runs"] == [4, 2] and rank1["runs"] == [2, 4]
        assert rank0["prompts"][-1] == rank1["prompts"][0]  # the split group
    losses = [entry["loss"] for entry in trl_run["ranks"][0]["log_history"] if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_trl_got_rewardd_rewards_of_each_row_with_its_own_answer(trl_run: dict,
                                                                 rewardd_url: str) -> None:
    """Each completion rescored alone, with its own row's answer and token count, gets what
    TRL's reward functions returned: groups, references and num_tokens were rebuilt right."""
    rows = [(p, c, ids, a) for rank0, rank1 in steps(trl_run) for batch in (rank0, rank1)
            for p, c, ids, a in zip(batch["prompts"], batch["completions"],
                                    batch["completion_ids"], batch["answers"])]
    got = [row for rank0, _ in steps(trl_run) for row in rank0["rewards"]]  # gathered batch
    request = {"groups": [{"group_id": f"g{i}", "prompt": p, "reference": {"answer": a},
                           "rollouts": [{"rollout_id": f"r{i}", "completion": c,
                                         "num_tokens": len(ids)}]}
                          for i, (p, c, ids, a) in enumerate(rows)],
               "rewards": MATH_AND_LENGTH}
    answer = httpx.post(f"{rewardd_url}/v1/rewards", json=request, timeout=120).json()
    expected = [[g["rollouts"][0]["rewards"]["math"], g["rollouts"][0]["rewards"]["length"]]
                for g in answer["groups"]]
    assert [none_for_nan(row) for row in got] == expected
    assert any(row[0] is None for row in expected)  # the empty answer's failed math cells
    assert len({row[1] for row in expected}) > 1  # completions of several lengths


def test_trl_advantages_equal_rewardd_trl_profile(trl_run: dict, rewardd_url: str) -> None:
    """TRL's own advantages (gathered batch, blocks of 4, NaN-aware sums) recomputed by
    POST /v1/advantages with profile trl from the same rewards, to 1e-6."""
    worst = 0.0
    for rank0, rank1 in steps(trl_run):
        used = rank0["output_advantages"] + rank1["output_advantages"]
        rewards = [None if all(math.isnan(v) for v in row)
                   else sum(v for v in row if not math.isnan(v)) for row in rank0["rewards"]]
        request = {"groups": [{"group_id": f"g{g}", "rollouts": [
                       {"rollout_id": f"r{i}", "reward": rewards[i]}
                       for i in range(4 * g, 4 * g + 4)]} for g in range(len(rewards) // 4)],
                   "advantage": {"estimator": "grpo", "profile": "trl", "output": "scalar"}}
        answer = httpx.post(f"{rewardd_url}/v1/advantages", json=request, timeout=60)
        assert answer.status_code == 200, answer.text
        computed = [r["advantages"] for g in answer.json()["groups"] for r in g["rollouts"]]
        worst = max(worst, max(abs(a - b) for a, b in zip(used, computed, strict=True)))
        assert any(abs(a) > 0.1 for a in used)
    assert worst <= 1e-6


def test_trl_logged_each_component_and_the_failed_cells(trl_run: dict) -> None:
    logged = [entry for entry in trl_run["ranks"][0]["log_history"] if "loss" in entry]
    for entry in logged:
        assert {"rewards/math/mean", "rewards/length/mean", "rewardd/failed_cells"} <= set(entry)
    # 4 failed math cells (the empty answer's group) in one step, averaged over 2 processes
    assert sorted(entry["rewardd/failed_cells"] for entry in logged) == [0.0, 2.0]


def test_trl_component_functions_sent_one_request_per_batch(trl_run: dict) -> None:
    # 2 steps x 2 processes, two reward functions each: 4 requests, not 8
    assert trl_run["requests"] == {"/v1/rewards": 4, "/v1/advantages": 0, "/v1/score": 0}


def tempo_expected(run: dict[str, Any], url: str) -> list[list[list[float]]]:
    """Per step, per completion of the gathered batch: rewardd's tempo advantages (profile
    trl), from a request built here from what TRL recorded."""
    out = []
    for rank0, rank1 in steps(run):
        ids = rank0["completion_ids"] + rank1["completion_ids"]
        rewards = none_for_nan([row[0] for row in rank0["rewards"]])
        request = {"groups": [{"group_id": f"g{g}", "rollouts": [
                       {"rollout_id": f"r{i}", "token_ids": ids[i], "num_tokens": len(ids[i]),
                        "rewards": {"rewardd": rewards[i]}} for i in range(4 * g, 4 * g + 4)]}
                       for g in range(len(ids) // 4)],
                   "advantage": {"estimator": "tempo", "params": {"beta": 1.0},
                                 "profile": "trl", "output": "dense"}}
        answer = httpx.post(f"{url}/v1/advantages", json=request, timeout=60)
        assert answer.status_code == 200, answer.text
        values = {r["rollout_id"]: r["advantages"] for g in answer.json()["groups"]
                  for r in g["rollouts"]}
        out.append([dense(values[f"r{i}"], len(ids[i])) for i in range(len(ids))])
    return out


def test_trl_loss_used_rewardd_tempo_per_token_advantages(tempo_run: dict,
                                                          rewardd_url: str) -> None:
    expected = tempo_expected(tempo_run, rewardd_url)
    varying = 0
    for rank, record in enumerate(tempo_run["ranks"]):
        assert len(record["loss_inputs"]) == 2  # one loss batch per step
        for step, (batch, loss) in enumerate(zip(record["batches"], record["loss_inputs"])):
            # the loss batch is TRL's shuffle of the step's batch: find each row's place
            place = {(tuple(p), tuple(c)): i for i, (p, c) in
                     enumerate(zip(batch["output_prompt_ids"], batch["output_completion_ids"]))}
            for prompt, completion, used in zip(loss["prompt_ids"], loss["completion_ids"],
                                                loss["advantages"]):
                i = place[(tuple(prompt), tuple(completion))]
                want = expected[step][6 * rank + i]
                assert len(want) == len(batch["completion_ids"][i])
                varying += len({round(v, 6) for v in want}) > 1
                want = want + [0.0] * (len(used) - len(want))  # padding: 0
                assert max(abs(a - b) for a, b in zip(used, want, strict=True)) <= 1e-6
    assert varying > 0  # per-token values, not one scalar per completion


def test_trl_tempo_run_scored_each_step_in_one_request(tempo_run: dict) -> None:
    """Rewards and advantages of a step in one POST /v1/score from the main process, where
    the rewards-then-advantages path sent 3 per step (a /v1/rewards per process, then
    /v1/advantages: 4 and 2 in these 2 steps). The step holding the empty answer has partly
    failed rollouts (math fails, length passes): it alone asks /v1/advantages again, so TRL's
    None convention holds (test_trl_loss_used_rewardd_tempo_per_token_advantages)."""
    assert tempo_run["requests"] == {"/v1/rewards": 0, "/v1/advantages": 1, "/v1/score": 2}


def test_trl_tempo_run_was_conversational_with_an_async_reward(tempo_run: dict) -> None:
    batch = tempo_run["ranks"][0]["batches"][0]
    assert batch["prompts"][0][0]["role"] == "user"
    assert batch["completions"][0][0]["role"] == "assistant"
    logged = [e for e in tempo_run["ranks"][0]["log_history"] if "loss" in e]
    assert len(logged) == 2 and all("rewards/rewardd/mean" in e for e in logged)


def test_a_refused_advantages_request_fails_every_process(trl_python: str, tiny_qwen2: Path,
                                                         rewardd_url: str,
                                                         tmp_path: Path) -> None:
    """The main process alone asks rewardd; when rewardd refuses, every process raises the
    same error instead of waiting on the broadcast."""
    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [trl_python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(SCRIPTS / "trl_grpo.py"), "--model", str(tiny_qwen2), "--url", rewardd_url,
         "--out", str(tmp_path), "--mode", "tempo", "--estimator", "no_such_estimator",
         "--no-validate"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    errors = [(tmp_path / f"rank{r}.error").read_text() for r in (0, 1)]
    assert all(e.startswith(errors[0].split(":")[0]) for e in errors), errors
    assert all("422" in e and "no_such_estimator" in e for e in errors), errors


# ---- issue 16: every TRL option against GRPOTrainer's and RLOOTrainer's own code, float64 ---

TWO = {"components": ("a", "b")}
TRL_PARITY = [
    {"name": f"grpo scale_rewards={scale}", "trl": "grpo", "scale_rewards": scale,
     "spec": {"estimator": "grpo", "profile": "trl", "params": {"scale_rewards": scale}}}
    for scale in ("group", "batch", "none")
] + [
    {"name": f"grpo scale_rewards={scale}, 2 functions with None", "trl": "grpo",
     "scale_rewards": scale, "components": True, "inputs": TWO,
     "spec": {"estimator": "grpo", "profile": "trl", "params": {"scale_rewards": scale},
              "weights": {"a": 1.0, "b": 0.5}}}
    for scale in ("group", "batch", "none")
] + [
    {"name": "grpo normalize_then_sum (gdpo), 2 functions with None", "trl": "grpo",
     "aggregation": "normalize_then_sum", "components": True, "inputs": TWO,
     "spec": {"estimator": "grpo", "profile": "trl", "aggregate": "gdpo",
              "weights": {"a": 1.0, "b": 0.5}}},
    {"name": "rloo", "trl": "rloo", "spec": {"estimator": "rloo", "profile": "trl"}},
    {"name": "rloo normalize_advantages", "trl": "rloo", "normalize": True,
     "spec": {"estimator": "rloo", "profile": "trl",
              "params": {"normalize_advantages": True}}},
    {"name": "rloo normalize_advantages, 2 functions with None", "trl": "rloo",
     "normalize": True, "components": True, "inputs": TWO,
     "spec": {"estimator": "rloo", "profile": "trl", "params": {"normalize_advantages": True},
              "weights": {"a": 1.0, "b": 0.5}}},
]


def test_every_trl_option_matches_trls_own_advantage_code_in_float64(trl_python, tmp_path):
    """Issue 16's acceptance for TRL: each option on 64x8, 32x16, 128x2, ragged lengths (16
    groups of 4: TRL's contiguous blocks of num_generations) and masks with holes, within 2e-7
    of the statements of GRPOTrainer/RLOOTrainer._generate_and_score_completions that compute
    the advantages, run in float64 (rows with None in some or all reward functions included)."""
    from tests.trainers.parity import TOLERANCE, compare

    found = compare(trl_python, "parity_trl.py", TRL_PARITY, tmp_path, equal_sizes=True)
    worst = {option: max(row.values()) for option, row in found.items()}
    assert all(value <= TOLERANCE for value in worst.values()), worst


def test_zero_spread_groups_are_exact_zeros_where_trls_float32_leaves_noise(trl_python,
                                                                            tmp_path):
    """Issue 16, item 5: rewardd's exact 0 for a group with no spread, against TRL's
    advantage statements in float32 (as TRL runs them) and in float64."""
    from tests.trainers.parity import TOLERANCE, zero_spread_noise

    options = [o for o in TRL_PARITY if o["name"] in (
        "grpo scale_rewards=group", "grpo scale_rewards=batch", "grpo scale_rewards=none",
        "rloo")]
    found = zero_spread_noise(trl_python, "parity_trl.py", options, tmp_path)
    assert all(row["rewardd"] == 0.0 for row in found.values()), found
    assert all(row["float64"] <= TOLERANCE for row in found.values()), found
