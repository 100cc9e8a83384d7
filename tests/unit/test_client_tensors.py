"""rewardd_client.tensors: responses' advantages as padded (B, T) arrays, values computed by
hand in each test. (RLE against dense on a real server's response:
tests/e2e/test_client_tensors.py.)"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
import torch

from rewardd_client.tensors import advantages_tensor, rewards_list, rollouts


def response(*groups: list[dict[str, Any]]) -> dict[str, Any]:
    return {"groups": [{"group_id": f"g{i}", "rollouts": rs} for i, rs in enumerate(groups)]}


def rollout(rid: str, advantages: Any, num_tokens: int | None, reward: float | None = 1.0,
            **extra: Any) -> dict[str, Any]:
    return {"rollout_id": rid, "advantages": advantages, "num_tokens": num_tokens,
            "reward": reward, "rewards": {"c": reward}, "excluded": reward is None, **extra}


MIXED = response(
    [rollout("a", {"rle": [[0.5, 2], [-1.25, 1]]}, 3),
     rollout("b", [1.0, 2.0], 2)],
    [rollout("c", 0.75, 4),
     rollout("d", {"rle": []}, 0, reward=None)])

MIXED_VALUES = [[0.5, 0.5, -1.25, 0.0],
                [1.0, 2.0, 0.0, 0.0],
                [0.75, 0.75, 0.75, 0.75],
                [0.0, 0.0, 0.0, 0.0]]
MIXED_MASK = [[True, True, True, False],
              [True, True, False, False],
              [True, True, True, True],
              [False, False, False, False]]


def test_rle_dense_and_scalar_rows_are_right_padded_to_the_longest_rollout() -> None:
    values, mask = advantages_tensor(MIXED)
    assert values.dtype == np.float64 and mask.dtype == np.bool_
    assert values.tolist() == MIXED_VALUES
    assert mask.tolist() == MIXED_MASK


def test_torch_backend_gives_the_same_values_and_a_bool_mask() -> None:
    values, mask = advantages_tensor(MIXED, backend="torch")
    assert values.dtype == torch.float64 and mask.dtype == torch.bool
    assert values.tolist() == MIXED_VALUES
    assert mask.tolist() == MIXED_MASK


@pytest.mark.parametrize("backend,dtype", [("numpy", np.float32), ("numpy", "float32"),
                                           ("torch", torch.float32), ("torch", "float32")])
def test_dtype_casts_once_at_the_end(backend: str, dtype: Any) -> None:
    third = response([rollout("a", {"rle": [[1 / 3, 2]]}, 2)])
    values, _ = advantages_tensor(third, backend, dtype)
    assert str(values.dtype).endswith("float32")
    assert values.tolist() == [[float(np.float32(1 / 3))] * 2]


def test_max_len_truncates_longer_rollouts_and_pads_shorter_ones() -> None:
    values, mask = advantages_tensor(MIXED, max_len=2)
    assert values.tolist() == [[0.5, 0.5], [1.0, 2.0], [0.75, 0.75], [0.0, 0.0]]
    assert mask.tolist() == [[True, True], [True, True], [True, True], [False, False]]
    wide, wide_mask = advantages_tensor(MIXED, max_len=6)
    assert wide.tolist()[0] == [0.5, 0.5, -1.25, 0.0, 0.0, 0.0]
    assert wide_mask.tolist()[2] == [True] * 4 + [False] * 2


def test_rows_follow_the_given_rollout_ids() -> None:
    values, mask = advantages_tensor(MIXED, rollout_ids=["c", "a"])
    assert values.tolist() == [[0.75, 0.75, 0.75, 0.75], [0.5, 0.5, -1.25, 0.0]]
    assert mask.tolist() == [[True] * 4, [True, True, True, False]]
    assert [r["rollout_id"] for r in rollouts(MIXED, ["d", "b"])] == ["d", "b"]


def test_an_unknown_rollout_id_is_named() -> None:
    with pytest.raises(KeyError, match="'zz'"):
        advantages_tensor(MIXED, rollout_ids=["a", "zz"])


def test_negative_zero_and_subnormals_survive_bit_for_bit() -> None:
    tiny = 5e-324
    body = response([rollout("a", {"rle": [[-0.0, 1], [tiny, 2]]}, 3),
                     rollout("b", [-0.0, tiny, tiny], 3)])
    values, _ = advantages_tensor(body)
    bits = values.view(np.int64)
    assert (bits[0] == bits[1]).all()
    assert np.signbit(values[0, 0]) and values[0, 1] == tiny


def test_returns_field_is_decoded_like_advantages() -> None:
    body = response([rollout("a", 0.0, 2, returns={"rle": [[2.5, 1], [1.5, 1]]})])
    values, _ = advantages_tensor(body, field="returns")
    assert values.tolist() == [[2.5, 1.5]]


def test_rewards_list_gives_none_for_excluded_rollouts_and_components() -> None:
    assert rewards_list(MIXED) == [1.0, 1.0, 1.0, None]
    assert rewards_list(MIXED, ["d", "a"], component="c") == [None, 1.0]


@pytest.mark.parametrize("item,message", [
    (rollout("a", None, 3), "'a' has no advantages: ask with advantage.output"),
    (rollout("a", 0.5, None), "'a' has a scalar advantages and no num_tokens"),
    (rollout("a", {"rle": [[1.0, 2]]}, 3), "'a': advantages cover 2 tokens, num_tokens is 3"),
    (rollout("a", [1.0], 2), "'a': advantages cover 1 tokens, num_tokens is 2"),
])
def test_inconsistent_rollouts_are_refused_with_their_id(item: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(ValueError, match=message):
        advantages_tensor(response([item]))


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend must be 'numpy' or 'torch', not 'jax'"):
        advantages_tensor(MIXED, backend="jax")  # type: ignore[arg-type]


def test_empty_batch_gives_empty_arrays() -> None:
    values, mask = advantages_tensor({"groups": []})
    assert values.shape == (0, 0) and mask.shape == (0, 0)


def test_a_missing_backend_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(ImportError, match=r"needs torch: pip install 'rewardd-client\[torch\]'"):
        advantages_tensor(MIXED, backend="torch")


def test_torch_without_numpy_builds_the_same_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "numpy", None)  # import numpy -> ImportError
    values, mask = advantages_tensor(MIXED, backend="torch", max_len=3)
    assert values.dtype == torch.float64
    assert values.tolist() == [row[:3] for row in MIXED_VALUES]
    assert mask.tolist() == [row[:3] for row in MIXED_MASK]
