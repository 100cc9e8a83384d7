"""OpenRLHF 0.11.2's own HTTP reward client (``--reward.remote_url http://.../get_reward``)
against rewardd's POST /get_reward, in a real server.

The trainer's environment runs OpenRLHF's ``SingleTurnAgentExecutor`` as its vLLM engine
actor builds it (the URL list split on commas; no ``.py``, so the HTTP path): ``execute``
tokenizes each prompt with a real tokenizer, takes the scripted generation, decodes prompt +
response into the query and posts ``{"query", "prompts", "labels"}`` with its own aiohttp
code (``_fetch_rewards_via_http``), then keeps ``rewards``, ``scores`` and ``extra_logs`` of
the answer. Only vLLM's engine is replaced (``ScriptedEngine`` of
scripts/openrlhf_reward_func.py). Group mode runs the samples concurrently, as the engine
actor does, against a server whose REWARDD_COMPAT_CONFIG asks for groups and GRPO
advantages, and compares with /v1/score on the same groups. Given two URLs, OpenRLHF
alternates between them request by request; two pods sharing Redis then hold each group
between them and answer each sample with its group's advantage.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import redis
import torch

from tests.faults.test_compat_faults import group_docs, pid_of
from tests.support.redis_server import RedisServer
from tests.support.server import running_server, server_process
from tests.trainers.conftest import SCRIPTS, run_script, trainer_python
from tests.trainers.test_openrlhf import CHAT_1, CHAT_2, tokenizer_dir  # noqa: F401 (fixture)

CALLER = """
import asyncio, json, sys
from types import SimpleNamespace

sys.path.insert(0, {scripts!r})
from openrlhf_reward_func import ScriptedEngine, as_number  # noqa: E402
from openrlhf.utils.agent import SingleTurnAgentExecutor  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


async def run(url, tokenizer_dir, cases):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    # train_ppo_ray: args.reward.remote_url = args.reward.remote_url.split(",")
    executor = SingleTurnAgentExecutor(remote_rm_url=url.split(","))
    assert executor.reward_func is None and executor.reward_endpoints == url.split(",")

    async def one(case):
        engine = ScriptedEngine(tokenizer, {{case["prompt"]: case["response"]}})
        params = SimpleNamespace(max_tokens=64, logprobs=None)
        out = await executor.execute(case["prompt"], case["label"], params, max_length=256,
                                     hf_tokenizer=tokenizer, llm_engine=engine)
        return {{"reward": as_number(out["reward"]), "scores": as_number(out["scores"]),
                 "extra_logs": out["extra_logs"]}}

    return await asyncio.gather(*(one(case) for case in cases))  # as the engine actor does


url, tokenizer_dir, cases_path, out_path = sys.argv[1:5]
cases = json.load(open(cases_path, encoding="utf-8"))
json.dump(asyncio.run(run(url, tokenizer_dir, cases)), open(out_path, "w", encoding="utf-8"))
"""

CASES = [
    {"prompt": CHAT_1, "label": "4", "response": "Two plus two is \\boxed{4}."},
    {"prompt": CHAT_1, "label": "4", "response": "It is \\boxed{5}."},
    {"prompt": CHAT_2, "label": "5", "response": "3x = 15, so x = \\boxed{5}"},
    {"prompt": CHAT_2, "label": "5", "response": "x = \\boxed{3}"},
]


def call_openrlhf(url: str, cases: list[dict], tokenizer_dir: Path, tmp_path: Path) -> list:
    script, cases_path, out_path = (tmp_path / "caller.py", tmp_path / "cases.json",
                                    tmp_path / "out.json")
    script.write_text(CALLER.format(scripts=str(SCRIPTS)))
    cases_path.write_text(json.dumps(cases))
    run_script(trainer_python("REWARDD_OPENRLHF_PYTHON", "test-openrlhf-slime"),
               [str(script), url, str(tokenizer_dir), str(cases_path), str(out_path)],
               timeout_s=600)
    return json.loads(out_path.read_text())


@pytest.mark.trainers
def test_openrlhfs_http_client_gets_a_math_reward_per_sample_out_of_the_box(
        rewardd_url, tokenizer_dir, tmp_path):
    cases = CASES + [{"prompt": CHAT_2, "label": "\\frac{", "response": "x = \\boxed{5}"}]
    results = call_openrlhf(f"{rewardd_url}/get_reward", cases, tokenizer_dir, tmp_path)
    # experience maker: torch.tensor([value]) of the answer's one-entry lists
    assert [r["reward"] for r in results] == [[[1.0]], [[0.0]], [[1.0]], [[0.0]], [[0.0]]]
    assert [r["scores"] for r in results] == [r["reward"] for r in results]
    assert [r["extra_logs"]["correct"] for r in results] == [[1.0], [0.0], [1.0], [0.0], [0.0]]
    # the bad label: its fallback, and OpenRLHF's logs say the check failed
    assert [r["extra_logs"]["rewardd_failed"] for r in results] == [[0.0]] * 4 + [[1.0]]
    # the tokenizer's decode gives back each prompt: only the completion was scored
    assert all(r["extra_logs"]["rewardd_prompt_mismatch"] == [0.0] for r in results)


GROUPED = {"rewards": [{"name": "correct", "verifier": "math", "fallback": 0.0}],
           "group": {"size": 2, "timeout_s": 120,
                     "advantage": {"estimator": "grpo", "profile": "openrlhf"}},
           "openrlhf": {"value": "advantage"}}


@pytest.mark.trainers
def test_in_group_mode_each_sample_gets_its_groups_advantage_as_v1_score_computes_it(
        tokenizer_dir, tmp_path):
    with running_server("--pool-size", "1",
                        env={"REWARDD_COMPAT_CONFIG": json.dumps(GROUPED)}) as url:
        results = call_openrlhf(f"{url}/get_reward", CASES, tokenizer_dir, tmp_path)
        direct = httpx.post(f"{url}/v1/score", timeout=120, json={
            "rewards": GROUPED["rewards"],
            "advantage": {**GROUPED["group"]["advantage"], "output": "scalar"},
            "groups": [{"group_id": label, "prompt": prompt, "reference": {"answer": label},
                        "rollouts": [{"rollout_id": str(i), "completion": c["response"] + "</s>"}
                                     for i, c in enumerate(CASES) if c["prompt"] == prompt]}
                       for prompt, label in ((CHAT_1, "4"), (CHAT_2, "5"))]}).json()
    expected = [ro["advantages"] for g in direct["groups"] for ro in g["rollouts"]]
    # what the experience maker keeps: torch.tensor([[value]]), float32 (its default dtype)
    assert [r["reward"] for r in results] == [torch.tensor([[a]]).tolist() for a in expected]
    assert expected[0] > 0 > expected[1] and expected[2] > 0 > expected[3]
    assert [r["scores"] for r in results] == [[[1.0]], [[0.0]], [[1.0]], [[0.0]]]
    assert all(r["extra_logs"]["rewardd_group_size"] == [2.0] for r in results)


# n_samples_per_prompt = 4: three right and one wrong, then one right and three wrong (the
# responses of a prompt differ, so each sample is known by its completion)
N = 4
CASES_N = [{"prompt": CHAT_1, "label": "4", "response": r} for r in (
    "Two plus two is \\boxed{4}.", "It is \\boxed{5}.", "\\boxed{4}", "2 + 2 = \\boxed{4}")] + [
    {"prompt": CHAT_2, "label": "5", "response": r} for r in (
        "x = \\boxed{3}", "3x = 15, so x = \\boxed{5}", "x = \\boxed{15}", "\\boxed{20}")]


@pytest.mark.trainers
def test_given_two_pods_openrlhf_alternates_between_them_and_each_group_spans_both(
        tokenizer_dir, tmp_path):
    """``--reward.remote_url a,b``: OpenRLHF's executor takes the next URL of a cycle for
    every request (``_fetch_rewards_via_http``: ``rm = next(self._reward_endpoint_cycle)``),
    so with one sample per request the samples alternate between the pods and each group of
    four reaches both. The pods share a private Redis (REWARDD_STATE_URL), checks embedded;
    the standing session's group documents there say which pod took each sample and in
    which order the group got them."""
    config = {**GROUPED, "group": {**GROUPED["group"], "size": N}}
    redis_server = RedisServer().start()
    env = {"REWARDD_STATE_URL": redis_server.url(),
           "REWARDD_COMPAT_CONFIG": json.dumps(config)}
    try:
        with server_process("--pool-size", "1", env=env) as (url_a, proc_a), \
                server_process("--pool-size", "1", env=env) as (url_b, proc_b):
            results = call_openrlhf(f"{url_a}/get_reward,{url_b}/get_reward", CASES_N,
                                    tokenizer_dir, tmp_path)
            docs = group_docs(redis.Redis.from_url(redis_server.url()))
            order = {d["prompt"]: [r["body"]["completion"] for r in d["rollouts"]]
                     for d in docs}
            direct = httpx.post(f"{url_b}/v1/score", timeout=120, json={
                "rewards": config["rewards"],
                "advantage": {**config["group"]["advantage"], "output": "scalar"},
                "groups": [{"group_id": label, "prompt": prompt,
                            "reference": {"answer": label},
                            "rollouts": [{"rollout_id": c, "completion": c}
                                         for c in order[prompt]]}
                           for prompt, label in ((CHAT_1, "4"), (CHAT_2, "5"))]}).json()
    finally:
        redis_server.close()
    # two groups, each with two samples taken by each pod
    assert sorted(order) == sorted([CHAT_1, CHAT_2])
    pods = {proc_a.pid: "a", proc_b.pid: "b"}
    assert [sorted(pods[pid_of(r)] for r in d["rollouts"]) for d in docs] == [
        ["a", "a", "b", "b"]] * 2
    advantage = {ro["rollout_id"]: ro["advantages"]
                 for g in direct["groups"] for ro in g["rollouts"]}
    expected = [advantage[c["response"] + "</s>"] for c in CASES_N]
    assert [r["reward"] for r in results] == [torch.tensor([[a]]).tolist() for a in expected]
    assert expected[0] > 0 > expected[1] and expected[5] > 0 > expected[4]
    assert expected[0] != expected[5]  # 3 of 4 right is not 1 of 4 right
    assert [r["scores"] for r in results] == [[[1.0]], [[0.0]], [[1.0]], [[1.0]],
                                              [[0.0]], [[1.0]], [[0.0]], [[0.0]]]
    assert all(r["extra_logs"]["rewardd_group_size"] == [float(N)] for r in results)
