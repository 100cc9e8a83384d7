"""rewardd_client.openrlhf: OpenRLHF 0.11.2's own reward-function path against a real server.

OpenRLHF installs on CPU with ``--no-deps`` plus what ``openrlhf.utils.agent`` imports
(aiohttp, sympy, pylatexenc, torch, transformers): that module holds the code that loads a
``reward_func`` from a ``.py`` path and calls it, and nothing of it is stubbed. Only vLLM's
engine is replaced by scripted generations (see scripts/openrlhf_reward_func.py): vLLM is not
OpenRLHF and does not run here. The request builder is checked without a server too (those
tests run in ``make test``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rewardd_client.openrlhf import build_request, response_of, reward_function
from tests.support.tiny_models import build_tiny_lm
from tests.trainers.conftest import SCRIPTS, run_script, trainer_python

MATH = [{"name": "math", "verifier": "math"}]


def openrlhf_python() -> str:
    return trainer_python("REWARDD_OPENRLHF_PYTHON", "test-openrlhf-slime")


def test_runs_of_equal_prompts_and_labels_become_groups_in_one_request():
    queries = ["P1 a", "P1 b", "P2 c", "P1 d", "P1 e"]
    prompts = ["P1 ", "P1 ", "P2 ", "P1 ", "P1 "]
    labels = ["4", "4", {"answer": "7", "unit": "m"}, "9", "8"]
    body, keys = build_request(queries, prompts, labels, MATH)
    assert body == {"rewards": MATH, "groups": [
        {"group_id": "0", "prompt": "P1 ", "reference": {"answer": "4"},
         "rollouts": [{"rollout_id": "0", "completion": "a"},
                      {"rollout_id": "1", "completion": "b"}]},
        {"group_id": "1", "prompt": "P2 ", "reference": {"answer": "7", "unit": "m"},
         "rollouts": [{"rollout_id": "2", "completion": "c"}]},
        {"group_id": "2", "prompt": "P1 ", "reference": {"answer": "9"},
         "rollouts": [{"rollout_id": "3", "completion": "d"}]},
        {"group_id": "3", "prompt": "P1 ", "reference": {"answer": "8"},
         "rollouts": [{"rollout_id": "4", "completion": "e"}]},
    ]}
    assert keys == [("0", "0"), ("0", "1"), ("1", "2"), ("2", "3"), ("3", "4")]


def test_a_query_not_starting_with_its_prompt_is_scored_whole_with_a_warning():
    with pytest.warns(RuntimeWarning, match="does not start with its prompt"):
        assert response_of("Q: 2+2? \\boxed{4}", "Q: 2 + 2?") == "Q: 2+2? \\boxed{4}"
    assert response_of("Q: 2+2? \\boxed{4}", "Q: 2+2? ") == "\\boxed{4}"


def test_unequal_lengths_are_refused_naming_each_length():
    with pytest.raises(ValueError, match="queries, prompts and labels differ in length: 2, 1, 1"):
        build_request(["a", "b"], ["p"], ["4"], MATH)


def test_the_writer_refuses_a_path_openrlhf_would_not_load(tmp_path):
    from rewardd_client.openrlhf import main
    with pytest.raises(SystemExit):
        main(["--write", str(tmp_path / "reward.txt")])


CHAT_1 = "<|user|>\nWhat is two plus two?</s>\n<|assistant|>\n"
CHAT_2 = "<|user|>\nSolve for x: 3x + 5 = 20</s>\n<|assistant|>\n"
CASES = [
    {"prompt": CHAT_1, "label": "4", "response": "Two plus two is \\boxed{4}."},
    {"prompt": CHAT_1, "label": "4", "response": "It is \\boxed{5}."},
    {"prompt": CHAT_2, "label": "5", "response": "3x = 15, so x = \\boxed{5}"},
    {"prompt": CHAT_2, "label": "\\frac{", "response": "x = \\boxed{5}"},  # bad reference
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    return build_tiny_lm(tmp_path_factory.mktemp("tiny-lm"))


def run_openrlhf(python: str, reward_file: Path, tokenizer_dir: Path, cases: list[dict],
                 tmp_path: Path) -> tuple[list[dict], str]:
    cases_path, out_path = tmp_path / "cases.json", tmp_path / "out.json"
    cases_path.write_text(json.dumps(cases))
    proc = run_script(python, [str(SCRIPTS / "openrlhf_reward_func.py"), str(reward_file),
                               str(tokenizer_dir), str(cases_path), str(out_path)],
                      timeout_s=600)
    return json.loads(out_path.read_text()), proc.stdout + proc.stderr


@pytest.mark.trainers
def test_openrlhf_loads_the_written_file_and_trains_on_rewardd_rewards(rewardd_url, tokenizer_dir,
                                                                        tmp_path):
    python = openrlhf_python()
    reward_file = tmp_path / "reward_rewardd.py"
    run_script(python, ["-m", "rewardd_client.openrlhf", "--write", str(reward_file),
                        "--url", rewardd_url, "--rewards", "math"])
    results, log = run_openrlhf(python, reward_file, tokenizer_dir, CASES, tmp_path)

    assert [r["reward"] for r in results] == [[1.0], [0.0], [1.0], None]
    assert [r["scores"] for r in results] == [[1.0], [0.0], [1.0], None]
    assert [r["extra_logs"] for r in results[:3]] == [{"rewardd_math": [1.0]},
                                                     {"rewardd_math": [0.0]},
                                                     {"rewardd_math": [1.0]}]
    assert all(r["query_tail"].endswith("</s>") for r in results)  # special tokens kept
    # OpenRLHF catches the failure and logs it; the sample gets no reward, never a made-up 0
    assert "Failed to fetch reward" in log and "invalid_reference" in log
    assert "set a 'fallback' on the reward component" in log


@pytest.mark.trainers
def test_a_fallback_in_the_users_file_gives_the_failed_sample_its_value(rewardd_url,
                                                                        tokenizer_dir, tmp_path):
    reward_file = tmp_path / "reward_fallback.py"  # the user's own two lines
    reward_file.write_text(
        "from rewardd_client.openrlhf import reward_function\n"
        f"reward_func = reward_function({rewardd_url!r}, "
        "[{'name': 'math', 'verifier': 'math', 'fallback': -1.0}])\n")
    results, _ = run_openrlhf(openrlhf_python(), reward_file, tokenizer_dir, CASES[2:], tmp_path)
    assert [r["reward"] for r in results] == [[1.0], [-1.0]]


@pytest.mark.trainers
def test_a_batch_call_is_one_request_with_components_logged(rewardd_url, tmp_path):
    """The batch form (OpenRLHF before 0.11 passed a whole batch): tensors of one entry per
    query, each component logged, ``scores`` from a chosen component."""
    reward_func = reward_function(rewardd_url, [
        {"name": "math", "verifier": "math", "weight": 1.0},
        {"name": "math_half", "verifier": "math", "weight": 0.5}], score_component="math")
    out = reward_func(["Q1 \\boxed{4}", "Q1 \\boxed{3}", "Q2 \\boxed{x}"],
                      ["Q1 ", "Q1 ", "Q2 "], ["4", "4", "x"])
    assert torch.equal(out["rewards"], torch.tensor([1.5, 0.0, 1.5]))
    assert torch.equal(out["scores"], torch.tensor([1.0, 0.0, 1.0]))
    assert {k: v.tolist() for k, v in out["extra_logs"].items()} == {
        "rewardd_math": [1.0, 0.0, 1.0], "rewardd_math_half": [1.0, 0.0, 1.0]}



# ---- issue 16: every OpenRLHF option against its own experience-maker code, float64 --------

def _orl(name: str, estimator: str, params: dict | None = None, inputs: dict | None = None,
         **openrlhf: object) -> dict:
    """An option: rewardd's ``estimator`` (OpenRLHF's name) with ``params`` against OpenRLHF
    run with ``openrlhf`` settings (kl_coef, gamma, lam, clip_range, no_std_norm)."""
    return {"name": name, "openrlhf": estimator, **openrlhf, "inputs": inputs or {},
            "spec": {"estimator": estimator, "profile": "openrlhf", "params": params or {}}}


KL = {"kl": True}
OPENRLHF_PARITY = [
    _orl("group_norm", "group_norm"),
    _orl("rloo", "rloo"),
    _orl("dr_grpo", "dr_grpo"),
    _orl("reinforce_baseline", "reinforce_baseline"),
    _orl("reinforce", "reinforce"),
    _orl("reinforce gamma=0.9 (holes are steps)", "reinforce", {"gamma": 0.9}, gamma=0.9),
    _orl("gae gamma=0.95 lam=0.9 (holes are steps)", "gae", {"gamma": 0.95, "lam": 0.9},
         {"values": True}, gamma=0.95, lam=0.9),
    _orl("group_norm kl_coef=0.05", "group_norm", {"kl_coef": 0.05}, KL, kl_coef=0.05),
    _orl("rloo kl_coef=0.05", "rloo", {"kl_coef": 0.05}, KL, kl_coef=0.05),
    _orl("dr_grpo kl_coef=0.05", "dr_grpo", {"kl_coef": 0.05}, KL, kl_coef=0.05),
    _orl("reinforce_baseline kl_coef=0.05", "reinforce_baseline", {"kl_coef": 0.05}, KL,
         kl_coef=0.05),
    _orl("reinforce gamma=0.9 kl_coef=0.05", "reinforce", {"gamma": 0.9, "kl_coef": 0.05}, KL,
         gamma=0.9, kl_coef=0.05),
    _orl("gae kl_coef=0.05", "gae", {"gamma": 0.95, "lam": 0.9, "kl_coef": 0.05},
         {"values": True, "kl": True}, gamma=0.95, lam=0.9, kl_coef=0.05),
    _orl("group_norm clip_range=[-0.5,0.5]", "group_norm", {"clip_range": [-0.5, 0.5]},
         clip_range=[-0.5, 0.5]),
    _orl("rloo clip_range=[-0.5,0.5] kl_coef=0.05", "rloo",
         {"clip_range": [-0.5, 0.5], "kl_coef": 0.05}, KL, clip_range=[-0.5, 0.5],
         kl_coef=0.05),
    _orl("reinforce_baseline clip_range=[-0.3,0.6]", "reinforce_baseline",
         {"clip_range": [-0.3, 0.6]}, clip_range=[-0.3, 0.6]),
    _orl("reinforce clip_range=[-0.5,0.5]", "reinforce", {"clip_range": [-0.5, 0.5]},
         clip_range=[-0.5, 0.5]),
    _orl("gae clip_range=[-0.5,0.5]", "gae", {"clip_range": [-0.5, 0.5], "gamma": 0.95,
                                              "lam": 0.9}, {"values": True},
         clip_range=[-0.5, 0.5], gamma=0.95, lam=0.9),
    _orl("gae no_std_norm", "gae", {"no_std_norm": True, "gamma": 0.95, "lam": 0.9},
         {"values": True}, no_std_norm=True, gamma=0.95, lam=0.9),
    _orl("reinforce no_std_norm", "reinforce", {"no_std_norm": True}, no_std_norm=True),
    _orl("reinforce_baseline no_std_norm", "reinforce_baseline", {"no_std_norm": True},
         no_std_norm=True),
]


@pytest.mark.trainers
@pytest.mark.timeout(900)
def test_every_openrlhf_option_matches_openrlhfs_own_code_in_float64(tmp_path):
    """Issue 16's acceptance for OpenRLHF: each option on 64x8, 32x16, 128x2, ragged lengths
    (16 groups of 4: OpenRLHF groups contiguous blocks of one size) and masks with holes,
    within 2e-7 of OpenRLHF's compute_advantages_and_returns in float64 (mask-1 tokens)."""
    from tests.trainers.parity import TOLERANCE, compare

    found = compare(openrlhf_python(), "parity_openrlhf.py", OPENRLHF_PARITY, tmp_path,
                    equal_sizes=True)
    worst = {option: max(row.values()) for option, row in found.items()}
    assert all(value <= TOLERANCE for value in worst.values()), worst


@pytest.mark.trainers
@pytest.mark.timeout(900)
def test_zero_spread_groups_are_exact_zeros_where_openrlhfs_float32_leaves_noise(tmp_path):
    """Issue 16, item 5: rewardd's exact 0 for a group with no spread, against OpenRLHF's
    code in float32 (as it runs) and in float64."""
    from tests.trainers.parity import TOLERANCE, zero_spread_noise

    options = [o for o in OPENRLHF_PARITY if o["name"] in ("group_norm", "rloo", "dr_grpo")]
    found = zero_spread_noise(openrlhf_python(), "parity_openrlhf.py", options, tmp_path)
    assert all(row["rewardd"] == 0.0 for row in found.values()), found
    assert all(row["float64"] <= TOLERANCE for row in found.values()), found
