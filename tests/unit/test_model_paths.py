"""Issue 15 row 8: every model-file path a request names (reward_model ``model`` and
``tokenizer``, a local judge's ``backend.model``) is confined to REWARDD_MODEL_ROOTS after
resolving symlinks and ``..``; the loader gets the checked real path; and the refusal reads
the same whether or not the path exists (no probing of the worker's file system).

No model is loaded here: the loader is replaced by a recorder, so these tests take
milliseconds and check exactly which path would have been opened.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rewardd.verifiers import REGISTRY
from rewardd.verifiers.base import FailureKind, Sample, run_group_verifier
from rewardd.verifiers.judge import reward_model
from rewardd.verifiers.judge.config import (BackendOverride, JudgeConfigError, check_model_path,
                                            reset_backends, resolve_backend)
from rewardd.verifiers.judge.local import ModelLoadError

ENDPOINT = "http://127.0.0.1:9"  # listed below; never reached: every call here stops earlier


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """models/ (the root) holding rm/, a link inside it to rm/, links out of it to an existing
    and to a missing directory; secret/ outside it."""
    root, secret = tmp_path / "models", tmp_path / "secret"
    (root / "rm").mkdir(parents=True)
    secret.mkdir()
    (secret / "weights.safetensors").write_bytes(b"")
    (root / "alias").symlink_to(root / "rm")
    (root / "escape").symlink_to(secret)
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    monkeypatch.setenv("REWARDD_MODEL_ROOTS", str(root))
    monkeypatch.setenv("REWARDD_MODEL_ENDPOINTS", ENDPOINT)
    monkeypatch.delenv("REWARDD_JUDGE_ALLOW_REQUEST_URLS", raising=False)
    return {"root": root, "secret": secret, "tmp": tmp_path}


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(path, kind) of every load the reward model verifier asks for; each load fails."""
    seen: list[tuple[str, str]] = []

    def record(path: str, kind: str, **_: Any) -> Any:
        seen.append((path, kind))
        raise ModelLoadError("recorded, not loaded")

    monkeypatch.setattr(reward_model, "load_model", record)
    return seen


def outside_paths(tree: dict[str, Path]) -> dict[str, str]:
    """Paths outside the root, existing or not, reached directly, by ``..`` or by a link."""
    root, secret, tmp = tree["root"], tree["secret"], tree["tmp"]
    return {"existing dir": str(secret),
            "existing file": str(secret / "weights.safetensors"),
            "missing": str(tmp / "nowhere"),
            "dotdot to existing": f"{root}/../secret",
            "dotdot through missing": f"{root}/nothing/../../secret",
            "dotdot to missing": f"{root}/../nowhere",
            "link to existing": str(root / "escape"),
            "link into existing": str(root / "escape" / "weights.safetensors"),
            "dangling link": str(root / "dangling"),
            "etc": "/etc",
            "relative": "../../../../../../etc"}


def rm_outcome(**params: Any) -> Any:
    [out] = run_group_verifier(REGISTRY["reward_model"], [Sample("an answer", "a question")],
                               {}, params)
    return out


def refusal_shape(message: str, path: str, field: str) -> str:
    """The message with the request's own echoed path taken out."""
    assert message.count(repr(path)) == 1, message
    return message.replace(repr(path), "<path>").replace(field, "<field>")


@pytest.mark.parametrize("field", ["model", "tokenizer"])
def test_reward_model_paths_outside_the_roots_are_refused_before_any_load(
        field: str, tree: dict[str, Path], loads: list[tuple[str, str]]) -> None:
    shapes = set()
    for case, path in outside_paths(tree).items():
        params = ({"model": path} if field == "model"
                  else {"endpoint": ENDPOINT, "tokenizer": path})
        out = rm_outcome(**params)
        assert out.error == FailureKind.judge_unavailable, case
        message = out.detail["message"]
        assert f"{field} {path!r} is not under REWARDD_MODEL_ROOTS" in message, case
        shapes.add(refusal_shape(message, path, field))
    assert loads == []  # nothing outside was opened, existing or not
    assert len(shapes) == 1, shapes  # one wording for all: existence is not told


def test_the_refusal_does_not_depend_on_existence_at_the_same_path(
        tree: dict[str, Path]) -> None:
    """The same request path refused while it is missing and after it is created."""
    path = str(tree["tmp"] / "later")
    with pytest.raises(JudgeConfigError) as missing:
        check_model_path(path, field="tokenizer")
    Path(path).mkdir()
    with pytest.raises(JudgeConfigError) as existing:
        check_model_path(path, field="tokenizer")
    assert str(missing.value) == str(existing.value)


def test_paths_inside_the_roots_load_by_their_real_path(
        tree: dict[str, Path], loads: list[tuple[str, str]]) -> None:
    root, real = tree["root"], os.path.realpath(tree["root"] / "rm")
    for path in (str(root / "rm"), str(root / "alias"), f"{root}/rm/../alias",
                 f"{root}/../models/rm"):
        out = rm_outcome(model=path)
        assert out.error == FailureKind.judge_unavailable
        assert out.detail["message"] == "recorded, not loaded"
        assert out.detail["model"] == path  # the outcome names what the request gave
    rm_outcome(endpoint=ENDPOINT, tokenizer=str(root / "alias"))
    assert loads == [(real, "sequence_classification")] * 4 + [(real, "tokenizer")]


def test_without_roots_every_path_is_refused_alike(tree: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   loads: list[tuple[str, str]]) -> None:
    monkeypatch.delenv("REWARDD_MODEL_ROOTS")
    shapes = set()
    for path in (str(tree["root"] / "rm"), str(tree["secret"]), str(tree["tmp"] / "nowhere")):
        message = rm_outcome(endpoint=ENDPOINT, tokenizer=path).detail["message"]
        assert "REWARDD_MODEL_ROOTS" in message and "not set" in message
        shapes.add(refusal_shape(message, path, "tokenizer"))
    assert len(shapes) == 1 and loads == []


def test_a_local_judge_model_chosen_by_a_request_is_confined_and_loaded_by_real_path(
        tree: dict[str, Path]) -> None:
    backends = tree["tmp"] / "judges.json"
    backends.write_text(json.dumps({"local": {"kind": "transformers",
                                              "model": str(tree["root"] / "rm")}}))
    env = {"REWARDD_JUDGE_BACKENDS_FILE": str(backends),
           "REWARDD_MODEL_ROOTS": str(tree["root"])}
    reset_backends()
    try:
        shapes = set()
        for case, path in outside_paths(tree).items():
            with pytest.raises(JudgeConfigError) as refused:
                resolve_backend(BackendOverride(name="local", model=path), env)
            shapes.add(refusal_shape(str(refused.value), path, "backend.model"))
        assert len(shapes) == 1, shapes
        chosen = resolve_backend(BackendOverride(name="local",
                                                 model=str(tree["root"] / "alias")), env)
        assert chosen.model == os.path.realpath(tree["root"] / "rm")
    finally:
        reset_backends()
