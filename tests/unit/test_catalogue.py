"""GET /v1/estimators documents every entry of the advantage catalogue."""

from __future__ import annotations

import pytest

from rewardd.advantages import ENTRIES
from rewardd.service.api.catalogue import list_estimators

CATALOGUE = {
    "estimator": {"grpo", "dr_grpo", "rloo", "opo", "gpg", "remax", "reinforce_pp",
                  "reinforce_pp_baseline", "gae", "passk", "grpo_passk", "segment",
                  "outcome_conditioned", "turn", "gigpo", "bipace", "tempo"},
    "aggregate": {"sum", "gdpo", "sa_mrpo", "dara", "gd2po"},
    "transform": {"rank", "prm_clip", "prm_delta", "overlong"},
    "reweight": {"difficulty", "ha_dw", "uniqueness", "gagar", "glpo", "modulate"},
    "filter": {"dynamic_sampling", "pairwise_sampling", "variance_priority", "budget",
               "ucb_curriculum"},
}


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_every_entry_of_the_design_catalogue_is_registered_with_its_kind(kind):
    assert {e.name for e in list_estimators(kind)} == CATALOGUE[kind]


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_entry_documents_formula_source_description_and_parameters(name):
    [info] = [e for e in list_estimators() if e.name == name]
    assert info.formula and info.source and len(info.description) > 40
    assert set(info.profiles) == {"rewardd", "verl", "trl", "openrlhf"}
    for param in info.params:
        assert param.type and param.description, f"{name}.{param.name} is undocumented"


def test_stateful_entries_say_so():
    stateful = {e.name for e in list_estimators() if e.stateful}
    assert stateful == {"ha_dw", "ucb_curriculum"}
