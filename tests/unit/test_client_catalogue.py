"""The TRL adapter checks its specs against the server's catalogue when it is built.

The catalogue is the server's own (``rewardd.service.api.catalogue``, serialised as the routes
answer), served by a client that reads nothing from the network; the unreachable case uses a
real client against a closed port with no retries.
"""

from __future__ import annotations

from typing import Any

import pytest

from rewardd.service.api.catalogue import list_estimators, list_verifiers
from rewardd_client import RewarddClient
from rewardd_client._catalogue import (CatalogueUnavailable, NotInCatalogue, check_advantage,
                                       check_rewards)
from rewardd_client.trl import (async_reward_functions, reward_function, reward_functions,
                                rewardd_advantages)
from tests.support.server import free_port
from tests.support.trl_standin import StandInTrainer, single_process_accelerate


class CatalogueOnly(RewarddClient):
    """A blocking client whose catalogue reads answer what the server's routes answer."""

    def __init__(self) -> None:
        super().__init__("http://catalogue.test", max_retries=0)
        self.reads: list[str] = []

    def verifiers(self) -> Any:
        self.reads.append("verifiers")
        return [v.model_dump(mode="json") for v in list_verifiers()]

    def estimators(self) -> Any:
        self.reads.append("estimators")
        return [e.model_dump(mode="json") for e in list_estimators()]


def closed_port_client() -> RewarddClient:
    return RewarddClient(f"http://127.0.0.1:{free_port()}", max_retries=0)


def test_an_unknown_verifier_fails_when_the_functions_are_made() -> None:
    client = CatalogueOnly()
    specs = [{"name": "math", "verifier": "math"}, {"name": "m2", "verifier": "mathh"}]
    with pytest.raises(NotInCatalogue) as caught:
        reward_functions(client.base_url, specs, client=client)
    error = caught.value
    assert (error.field, error.name) == ("rewards[1].verifier", "mathh")
    assert {"math", "length", "exact_match"} <= set(error.known)
    assert "did you mean 'math'?" in str(error) and "GET /v1/verifiers" in str(error)
    assert isinstance(error, ValueError)


def test_known_verifiers_pass_and_are_read_once_per_build() -> None:
    client = CatalogueOnly()
    functions = reward_functions(client.base_url, "math,length", client=client)
    assert [f.__name__ for f in functions] == ["math", "length"]
    assert client.reads == ["verifiers"]


def test_validate_false_builds_without_asking_the_server() -> None:
    function = reward_function(f"http://127.0.0.1:{free_port()}", "mathh", validate=False)
    assert function.__name__ == "mathh"


def test_an_unreachable_server_at_build_time_fails_and_says_what_to_do() -> None:
    with pytest.raises(CatalogueUnavailable) as caught:
        reward_function("http://unused", "math", client=closed_port_client())
    message = str(caught.value)
    assert "GET /v1/verifiers" in message and "validate=False" in message
    assert "Start the server" in message
    assert caught.value.__cause__ is not None  # the client's ConnectionFailed


def test_async_functions_are_checked_with_a_blocking_client_of_their_own(monkeypatch) -> None:
    made: list[tuple[str, dict]] = []

    class Checker(CatalogueOnly):
        def __init__(self, base_url: str, **options: Any) -> None:
            made.append((base_url, options))
            super().__init__()

    monkeypatch.setattr("rewardd_client.trl.RewarddClient", Checker)
    with pytest.raises(NotInCatalogue, match="mathh"):
        async_reward_functions("http://rewardd.test", "mathh", api_key="k", timeout=5.0)
    assert made == [("http://rewardd.test", {"wire": "json", "api_key": "k", "timeout": 5.0})]


@pytest.mark.parametrize("spec, profile", [
    ({"estimator": "tempo"}, "trl"),
    ({"estimator": "grpo_vectorized", "profile": "verl"}, "trl"),  # verl's own name for it
    ({"estimator": "rloo", "aggregate": "gdpo", "transforms": [{"name": "rank"}],
      "reweight": [{"name": "difficulty"}], "filters": [{"name": "dynamic_sampling"}]}, "trl"),
])
def test_known_advantage_names_pass(spec: dict, profile: str) -> None:
    check_advantage(CatalogueOnly(), spec, profile)


@pytest.mark.parametrize("spec, field", [
    ({"estimator": "no_such_estimator"}, "advantage.estimator"),
    ({"estimator": "grpo_vectorized"}, "advantage.estimator"),  # a verl alias, under trl
    ({"estimator": "grpo", "profile": "trll"}, "advantage.profile"),
    ({"estimator": "grpo", "aggregate": "avg"}, "advantage.aggregate"),
    ({"estimator": "grpo", "reweight": [{"name": "rank"}]}, "advantage.reweight[0].name"),
    ({"estimator": "grpo", "filters": [{"name": "budget"}, {"name": "x"}]},
     "advantage.filters[1].name"),
])
def test_unknown_advantage_names_are_named(spec: dict, field: str) -> None:
    with pytest.raises(NotInCatalogue) as caught:
        check_advantage(CatalogueOnly(), spec, "trl")
    assert caught.value.field == field


def test_rewardd_advantages_checks_its_spec_when_it_hooks(monkeypatch) -> None:
    single_process_accelerate(monkeypatch)
    client = CatalogueOnly()
    with pytest.raises(NotInCatalogue, match="no estimator 'tempoo'"):
        rewardd_advantages(StandInTrainer([], num_generations=2), client.base_url, "tempoo",
                           client=client)
    with pytest.raises(CatalogueUnavailable, match="GET /v1/estimators"):
        rewardd_advantages(StandInTrainer([], num_generations=2), "http://unused", "tempo",
                           client=closed_port_client())


def test_check_rewards_refuses_a_spec_without_a_known_verifier() -> None:
    with pytest.raises(NotInCatalogue) as caught:
        check_rewards(CatalogueOnly(), [{"name": "x"}])
    assert caught.value.field == "rewards[0].verifier"
