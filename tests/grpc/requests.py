"""Request bodies shared by the gRPC tests, as REST JSON; :func:`message` packs one into its
proto message with the service's own converter (per-token lists become Float32Row)."""

from __future__ import annotations

import copy
from typing import Any

from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc.convert import fill


def rollout(rollout_id: str, completion: str, num_tokens: int, **extra: Any) -> dict:
    return {"rollout_id": rollout_id, "completion": completion, "num_tokens": num_tokens,
            **extra}


SCORE = {
    "run_id": "grpc-run",
    "groups": [
        {"group_id": "HumanEval/0", "prompt": "What is 2+2?", "reference": {"answer": "4"},
         "rollouts": [rollout("a", "\\boxed{4}", 5), rollout("b", "\\boxed{5}", 3),
                      rollout("c", "it is \\boxed{4}", 7, mask=[1, 1, 0, 0, 1, 1, 1]),
                      rollout("d", "no idea", 1)]},
        {"group_id": "g2", "prompt": "Solve 3x = 9", "reference": {"answer": "3"},
         "rollouts": [rollout("e", "x = \\boxed{3}", 4), rollout("f", "x = \\boxed{2}", 2)]},
    ],
    "rewards": [{"name": "math", "verifier": "math"},
                {"name": "fmt", "verifier": "regex", "weight": 0.25,
                 "params": {"pattern": "boxed"}}],
    "advantage": {"estimator": "grpo", "output": "dense"},
}


def body(**advantage: Any) -> dict:
    out = copy.deepcopy(SCORE)
    out["advantage"].update(advantage)
    return out


def message(cls: type, data: dict) -> Any:
    return fill(cls(), copy.deepcopy(data))


def score_message(data: dict | None = None) -> pb.ScoreRequest:
    return message(pb.ScoreRequest, data if data is not None else SCORE)
