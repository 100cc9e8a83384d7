"""A second language: a Node.js client (@grpc/grpc-js, @grpc/proto-loader from npm) scores a
batch over gRPC against the real server and decodes the RaggedFloat32 advantages.

Its rows must equal Python's gRPC rows exactly (float32 -> JS number -> JSON -> Python float
is lossless) and REST's dense advantages rounded to float32. The npm packages install into
tests/grpc/node/node_modules (``npm ci`` from the committed package-lock.json; ``make
grpc-node-deps`` does the same). Without node the test is skipped with a reason that says
so in the summary; with node but a failing install it fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from rewardd.service.grpc import codegen
from rewardd.service.grpc.convert import rows_of
from tests.grpc.conftest import KEY, auth
from tests.support.node import node_at_least
from tests.grpc.requests import message
from rewardd.service.grpc import rewardd_pb2 as pb

pytestmark = pytest.mark.e2e

NODE_DIR = Path(__file__).resolve().parent / "node"
MIN_NODE = 18


def node_ready() -> str:
    """node's path, with the npm packages installed; skips loudly without node."""
    node = node_at_least(MIN_NODE, "is too old for @grpc/grpc-js")
    if node is None:
        pytest.skip("NODE.JS IS NOT INSTALLED: the gRPC client test in a second language did "
                    "not run. Install node 18+ and npm (apt-get install nodejs npm) to run it")
    stamp = NODE_DIR / "node_modules" / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        npm = shutil.which("npm")
        if npm is None:
            pytest.fail("node is installed but npm is not: install npm to fetch @grpc/grpc-js")
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return node


def test_node_decodes_ragged_float32_to_pythons_and_rests_advantages(grpc_server):
    node = node_ready()
    done = subprocess.run([node, "score_dense.mjs", grpc_server.target, KEY,
                           str(codegen.PROTO)], cwd=NODE_DIR, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    body = {"groups": [
        {"group_id": "HumanEval/0", "prompt": "What is 2+2?", "reference": {"answer": "4"},
         "rollouts": [{"rollout_id": "a", "completion": "\\boxed{4}", "num_tokens": 5},
                      {"rollout_id": "b", "completion": "\\boxed{5}", "num_tokens": 3},
                      {"rollout_id": "c", "completion": "it is \\boxed{4}", "num_tokens": 7,
                       "mask": [1, 1, 0, 0, 1, 1, 1]},
                      {"rollout_id": "d", "completion": "no idea", "num_tokens": 1}]},
        {"group_id": "g2", "prompt": "Solve 3x = 9", "reference": {"answer": "3"},
         "rollouts": [{"rollout_id": "e", "completion": "x = \\boxed{3}", "num_tokens": 4},
                      {"rollout_id": "f", "completion": "x = \\boxed{2}", "num_tokens": 2}]}],
        "rewards": [{"name": "math", "verifier": "math"}],
        "advantage": {"estimator": "grpo", "output": "dense"}}
    python = grpc_server.stub().Score(message(pb.ScoreRequest, body), metadata=auth(),
                                      timeout=60)
    rest = httpx.post(f"{grpc_server.url}/v1/score", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()
    assert got["kind"] == "dense"
    assert got["rollout_ids"] == ["a", "b", "c", "d", "e", "f"]
    assert got["rewards"] == [1, 0, 1, 0, 1, 0]
    assert got["rows"] == rows_of(python.advantages)
    assert got["rows"] == [np.asarray(r["advantages"], np.float32).tolist()
                           for g in rest["groups"] for r in g["rollouts"]]
    assert [len(r) for r in got["rows"]] == [5, 3, 7, 1, 4, 2]
    assert got["rows"][2][2:4] == [0, 0]  # masked tokens
    assert got["error"]["code"] == 3  # INVALID_ARGUMENT, naming the field as REST does
    assert got["error"]["details"].startswith("body.groups.0.rollouts.0.mask:")
