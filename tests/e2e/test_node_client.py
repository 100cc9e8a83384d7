"""A second language: Node.js (global fetch) scores a batch and decodes the RLE advantages.

tests/e2e/node/score_rle.mjs posts a math batch to a real ``rewardd serve`` with
``output: "rle"`` and decodes the runs to dense arrays; the same request with
``output: "dense"`` from Python must give the very same numbers (exact equality: JSON
numbers survive both parsers bit for bit, and the server's RLE decodes bit for bit to its
dense form). Node is a test dependency like bubblewrap: missing, the test fails saying what
to install; it never skips.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.support.node import node_at_least

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parent / "node" / "score_rle.mjs"
MIN_NODE = 18  # global fetch


def node_binary() -> str:
    node = node_at_least(MIN_NODE, "has no global fetch")
    if node is None:
        pytest.fail("the Node.js client test needs node 18 or newer: install it (apt-get install "
                    "nodejs, brew install node, or https://nodejs.org) and rerun")
    return node


def rollout(rollout_id: str, completion: str, num_tokens: int, **extra) -> dict:
    return {"rollout_id": rollout_id, "completion": completion, "num_tokens": num_tokens,
            **extra}


REQUEST = {
    "groups": [
        {"group_id": "HumanEval-0", "prompt": "What is 2+2?", "reference": {"answer": "4"},
         "rollouts": [rollout("a", "\\boxed{4}", 5), rollout("b", "\\boxed{5}", 3),
                      rollout("c", "it is \\boxed{4}", 7, mask=[1, 1, 0, 0, 1, 1, 1]),
                      rollout("d", "no idea", 1)]},
        {"group_id": "g2", "prompt": "Solve 3x = 9", "reference": {"answer": "3"},
         "rollouts": [rollout("e", "x = \\boxed{3}", 4), rollout("f", "x = \\boxed{3}", 2)]},
        {"group_id": "g3", "prompt": "1/3 as a fraction", "reference": {"answer": "\\frac{1}{3}"},
         "rollouts": [rollout("g", "\\boxed{\\frac{1}{3}}", 2),
                      rollout("h", "\\boxed{0.3}", 6), rollout("i", "\\boxed{1/3}", 3)]},
    ],
    "rewards": [{"name": "math", "verifier": "math"}],
    "advantage": {"estimator": "grpo"},
}


def test_node_decodes_rle_to_the_servers_dense_advantages(server, tmp_path):
    node = node_binary()
    request_path = tmp_path / "request.json"
    request_path.write_text(json.dumps(REQUEST))
    proc = subprocess.run([node, str(SCRIPT), server, str(request_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from_node = json.loads(proc.stdout)

    dense_request = {**REQUEST, "advantage": {**REQUEST["advantage"], "output": "dense"}}
    response = httpx.post(f"{server}/v1/score", json=dense_request, timeout=120)
    assert response.status_code == 200, response.text
    dense = {f"{g['group_id']}/{r['rollout_id']}": {"reward": r["reward"],
                                                    "advantages": r["advantages"]}
             for g in response.json()["groups"] for r in g["rollouts"]}

    assert from_node == dense
    # the batch is not trivial: rewards differ within groups, lengths and a mask vary
    assert [from_node[f"HumanEval-0/{k}"]["reward"] for k in "abcd"] == [1.0, 0.0, 1.0, 0.0]
    assert from_node["HumanEval-0/c"]["advantages"][2:4] == [0.0, 0.0]
    assert len({len(v["advantages"]) for v in from_node.values()}) > 3


def test_node_reports_the_servers_refusal(server, tmp_path):
    node = node_binary()
    request_path = tmp_path / "bad.json"
    request_path.write_text(json.dumps({**REQUEST, "rewards": []}))
    proc = subprocess.run([node, str(SCRIPT), server, str(request_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.startswith("rewardd answered 422:") and "rewards" in proc.stderr
