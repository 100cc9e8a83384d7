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


MALFORMED = b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 64
"""A length-delimited field claiming ~4 GB: no message parses from it."""


def chain_of(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def _framed(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def verify_bytes(levels: int) -> bytes:
    """A VerifyRequest (math, answer 1) whose reference is ``levels`` deep, serialized by
    hand from the inside out (the protobuf library's Struct.update recurses in Python and
    its parser stops at 100 message levels, about 33 of a Struct's)."""
    inner = b""  # the innermost {}, at level `levels` (the reference is level 1)
    for _ in range(levels - 2):
        entry = _framed(1, b"a") + _framed(2, _framed(5, inner))  # "a": {struct_value}
        inner = _framed(1, entry)
    answer = _framed(1, _framed(1, b"answer") + _framed(2, _framed(3, b"1")))
    reference = answer + _framed(1, _framed(1, b"deep") + _framed(2, _framed(5, inner)))
    head = pb.VerifyRequest(verifier="math", completion="\\boxed{1}").SerializeToString()
    return head + _framed(pb.VerifyRequest.DESCRIPTOR.fields_by_name["reference"].number,
                          reference)
