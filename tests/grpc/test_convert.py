"""The message <-> REST body conversion, without a server: hand-built messages and bodies."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from rewardd.advantages.errors import RequestInvalid
from rewardd.service.cli import main
from rewardd.service.grpc import rewardd_pb2 as pb
from rewardd.service.grpc.convert import fill, rows_of, score_response, score_wire, to_body
from rewardd.service.grpc.servicer import parse_message
from rewardd.service.models import AdvantagesRequest, VerifyRequest


def test_unset_optionals_are_absent_so_the_models_defaults_apply():
    message = pb.AdvantagesRequest(groups=[pb.Group(group_id="g", rollouts=[
        pb.Rollout(rollout_id="a", num_tokens=2, greedy=False, reward=0.0)])])
    assert to_body(message) == {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": "a", "num_tokens": 2, "greedy": False, "reward": 0.0}]}]}
    request = parse_message(message, AdvantagesRequest)
    assert request.advantage.estimator == "grpo" and request.advantage.output == "rle"


def test_struct_numbers_that_are_whole_read_as_ints():
    message = pb.VerifyRequest(verifier="math", completion="x",
                               params={"n": 3, "x": 0.5, "big": 2.0 ** 60, "l": [1, 2.5]})
    assert to_body(message)["params"] == {"n": 3, "x": 0.5, "big": 2.0 ** 60, "l": [1, 2.5]}
    assert isinstance(to_body(message)["params"]["n"], int)
    assert isinstance(to_body(message)["params"]["big"], float)  # past 2**53: kept a double
    assert "verifier" not in to_body(message)  # the REST path's parameter, not the body's


def test_float32_rows_become_lists_and_a_ragged_length_is_refused():
    row = np.asarray([1, 0, 0.25], "<f4").tobytes()
    message = pb.Rollout(rollout_id="a", mask=pb.Float32Row(data_f32le=row))
    assert to_body(message, ("r",))["mask"] == [1.0, 0.0, 0.25]
    with pytest.raises(RequestInvalid) as caught:
        to_body(pb.Rollout(rollout_id="a", kl=pb.Float32Row(data_f32le=row[:-2])), ("r",))
    assert list(caught.value.errors[0]["loc"]) == ["r", "kl", "data_f32le"]
    assert "10 bytes" in caught.value.errors[0]["msg"]


def test_a_fractional_mask_is_refused_at_its_element():
    message = pb.AdvantagesRequest(groups=[pb.Group(group_id="g", rollouts=[pb.Rollout(
        rollout_id="a", num_tokens=2, reward=1.0,
        mask=pb.Float32Row(data_f32le=np.asarray([1, 0.5], "<f4").tobytes()))])])
    with pytest.raises(RequestInvalid) as caught:
        parse_message(message, AdvantagesRequest)
    assert list(caught.value.errors[0]["loc"]) == ["body", "groups", 0, "rollouts", 0, "mask", 1]


def test_fill_packs_a_rest_body_and_to_body_reads_it_back():
    body = {"completion": "x", "reference": {"answer": "4"}, "num_tokens": 3, "timeout_s": 2.5}
    message = fill(pb.VerifyRequest(verifier="math"), body)
    assert to_body(message) == body
    assert parse_message(message, VerifyRequest).num_tokens == 3


def _payload(rows: list) -> dict:
    return {"groups": [{"group_id": "g", "rollouts": [
        {"rollout_id": f"r{i}", "reward": 1.0, "rewards": {}, "status": {}, "advantages": row,
         "num_tokens": 2, "excluded": False} for i, row in enumerate(rows)],
        "diagnostics": {"zero_spread": False, "singleton": False, "baseline_size": 2}}],
        "summary": {"rollouts": len(rows), "groups": 1, "failed_cells": 0,
                    "excluded_rollouts": 0, "zero_spread_groups": 0, "singleton_groups": 0,
                    "zero_advantage_fraction": None, "reward_mean": 1.0, "reward_std": 0.0}}


def test_dense_rows_pack_into_one_ragged_float32():
    out = score_response(_payload([np.asarray([0.1, -2.0, 0.0]), np.asarray([]),
                                   np.asarray([3.5])]))
    assert list(out.advantages.dense.row_offsets) == [0, 3, 3, 4]
    assert out.advantages.dense.data_f32le == np.asarray([0.1, -2, 0, 3.5], "<f4").tobytes()
    assert rows_of(out.advantages) == [[np.float32(0.1).item(), -2.0, 0.0], [], [3.5]]
    assert not out.HasField("returns")
    assert out.groups[0].rollouts[1].rollout_id == "r1"


def test_rle_rows_pack_into_parallel_arrays():
    out = score_response(_payload([{"rle": [[0.1, 2], [0.0, 1]]}, {"rle": []},
                                   {"rle": [[-1.5, 4]]}]))
    rle = out.advantages.rle
    assert (list(rle.values), list(rle.lengths), list(rle.row_offsets)) == \
        ([0.1, 0.0, -1.5], [2, 1, 4], [0, 2, 2, 3])
    assert rows_of(out.advantages) == [[0.1, 0.1, 0.0], [], [-1.5] * 4]


def test_scalar_and_none_outputs():
    assert list(score_response(_payload([0.5, -0.5])).advantages.scalar.values) == [0.5, -0.5]
    assert not score_response(_payload([None, None])).HasField("advantages")


def test_serve_has_the_grpc_port_flag():
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert "--grpc-port" in result.output and "REWARDD_GRPC_PORT" in result.output


def test_hand_framed_dense_bytes_parse_as_protobufs_own_message():
    rows = [np.linspace(-1, 1, 300), np.asarray([]), np.asarray([2.5] * 200)]  # > 127 bytes:
    wire = score_wire(_payload(rows))  # multi-byte varint lengths
    data = np.concatenate(rows).astype("<f4").tobytes()
    plain = pb.ScoreResponse.FromString(wire)
    expected = pb.ScoreResponse()
    expected.CopyFrom(plain)
    expected.ClearField("advantages")
    expected.advantages.dense.data_f32le = data
    expected.advantages.dense.row_offsets.extend([0, 300, 300, 500])
    assert plain == expected
    assert len(wire) == expected.ByteSize()


def test_an_unexpected_failure_is_internal_without_its_text(caplog):
    from google.rpc import code_pb2, error_details_pb2

    from rewardd.service.grpc.errors import status_of

    status = status_of(ZeroDivisionError("secret detail"))
    assert status.code == code_pb2.INTERNAL and "secret" not in status.message
    info = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(info)
    assert (info.domain, info.reason) == ("rewardd", "internal")
    assert "secret detail" in caplog.text  # logged on the server
