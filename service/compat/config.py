"""``REWARDD_COMPAT_CONFIG``: how the per-sample trainer protocols score what they receive.

OpenRLHF, slime and NeMo-Gym post one sample at a time with a label, not a rewardd request;
the server side of the mapping (which reward components, how a label becomes a reference,
whether samples wait for their group) cannot travel with those requests, so it is server
configuration. The setting is a path to a JSON or YAML file, or the JSON itself::

    {"rewards": [{"name": "correct", "verifier": "math", "fallback": 0.0}],
     "reference": {"answer": "{label}"},
     "label_format": "text",
     "group": {"size": 8, "timeout_s": 60, "on_timeout": "complete",
               "advantage": {"estimator": "grpo", "output": "scalar"}},
     "openrlhf": {"value": "advantage"},
     "slime": {"path": "/slime/reward", "reward_key": "reward"},
     "nemo_gym": {"label_field": "expected_answer"},
     "run_id": "exp-7"}

Every field has a default, and without the setting the defaults hold: the math verifier,
the label as the answer, each sample scored on its own. The file is validated when the
settings load (``rewardd serve`` refuses to start on a bad one, naming the field), through
the same models as ``/v1/score``'s ``rewards`` and ``advantage``.
"""

from __future__ import annotations

import importlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from rewardd.advantages.errors import RequestInvalid
from rewardd.advantages.models import Contract, Name
from rewardd.service.models import AdvantageSpec, RewardSpec, ScoreRequest
from rewardd.service.setting_files import SettingFileInvalid, read_setting_text
from rewardd.service.settings import Settings
from rewardd.service.validation import validate_score

LABEL = "{label}"
"""The placeholder of :attr:`CompatConfig.reference` that the sample's label replaces."""


class CompatConfigInvalid(ValueError):
    """A compat configuration that cannot be used; the message names the field and reason."""


def default_rewards() -> list[RewardSpec]:
    """The math verifier, with a fallback of 0.0: a per-sample protocol has no way to carry
    a missing reward (OpenRLHF and slime crash on ``null``, NeMo-Gym's ``reward`` is a
    float), so a failed check scores 0.0 and says so in the protocol's own failure field
    (OpenRLHF ``extra_logs.rewardd_failed``, slime ``failed``, NeMo-Gym ``mask_sample``)."""
    return [RewardSpec(name="correct", verifier="math", fallback=0.0)]


class GroupMode(Contract):
    """Samples wait for their group: for a group-level verifier (an arena) or group
    advantages. A group is the next ``size`` samples with the same prompt and label."""

    size: int = Field(ge=1, le=1024, description="Samples per group (the trainer's n_samples_"
                      "per_prompt / n-samples-per-prompt).")
    timeout_s: float = Field(
        60.0, gt=0, le=170, description="A group not complete this long after its first "
        "sample is scored from what arrived (or failed, see on_timeout). At most 170 s: "
        "OpenRLHF's client gives up after 180 s.")
    on_timeout: Literal["complete", "fail"] = Field(
        "complete", description="complete: score the samples that arrived (flagged "
        "`timed_out`); fail: answer each of them 504.")
    advantage: AdvantageSpec | None = Field(
        None, description="Group advantages, as /v1/score's `advantage` (output forced to "
        "scalar). Unset: rewards only.")


class OpenRLHFOptions(Contract):
    value: Literal["reward", "advantage"] = Field(
        "reward", description="What goes into `rewards` (`scores` always holds the reward): "
        "`advantage` needs group.advantage.")


class SlimeOptions(Contract):
    path: str = Field("/slime/reward", pattern=r"^/[A-Za-z0-9_./-]*$",
                      description="Route slime's --rm-url points at.")
    reward_key: Name = Field("reward", description="Key of the reward in the answer (slime's "
                             "--reward-key).")
    value: Literal["reward", "advantage"] = Field(
        "reward", description="What goes under reward_key: `advantage` needs group.advantage.")


class NemoGymOptions(Contract):
    label_field: str = Field(
        "expected_answer", min_length=1, description="Request field holding the label "
        "(resources servers' task data: math_with_judge uses `expected_answer`).")
    value: Literal["reward", "advantage"] = Field(
        "reward", description="What goes into `reward`: `advantage` needs group.advantage.")


class CompatConfig(Contract):
    """The whole setting (see the module docstring for an example)."""

    rewards: list[RewardSpec] = Field(
        default_factory=default_rewards, min_length=1, fail_fast=True,
        description="Reward components, as /v1/score's `rewards`.")
    reference: dict[str, Any] = Field(
        default_factory=lambda: {"answer": LABEL},
        description="The reference built from a text label: every string value has `{label}` "
        "replaced by the label. A label that is a JSON object is the reference itself.")
    label_format: Literal["text", "json"] = Field(
        "text", description="json: a string label is parsed as JSON; an object is the "
        "reference, anything else fills `{label}` as text.")
    group: GroupMode | None = None
    openrlhf: OpenRLHFOptions = Field(default_factory=OpenRLHFOptions)
    slime: SlimeOptions = Field(default_factory=SlimeOptions)
    nemo_gym: NemoGymOptions = Field(default_factory=NemoGymOptions)
    run_id: Name | None = Field(
        None, description="The run a request is recorded under when it names none "
        "(`?run_id=` on the URL the trainer posts to wins): for a trainer whose URL cannot "
        "carry it (NeMo-Gym posts to host:port/verify). Unset: only requests that name a run "
        "are recorded.")

    @field_validator("group")
    @classmethod
    def _scalar_advantages(cls, group: GroupMode | None) -> GroupMode | None:
        # one number per sample is all a per-sample protocol can carry
        if group is not None and group.advantage is not None:
            group.advantage = group.advantage.model_copy(update={"output": "scalar"})
        return group

    def model_post_init(self, _: Any) -> None:
        wants = [name for name, opts in (("openrlhf", self.openrlhf), ("slime", self.slime),
                                         ("nemo_gym", self.nemo_gym))
                 if opts.value == "advantage"]
        if wants and (self.group is None or self.group.advantage is None):
            raise ValueError(f"{', '.join(wants)}.value is `advantage` but group.advantage is "
                             "not set (advantages need groups)")
        if is_reserved(self.slime.path):
            raise ValueError(f"slime.path {self.slime.path!r} is another route of rewardd "
                             f"(the app's own routes come first, so slime would never be "
                             f"reached); choose a path outside "
                             f"{', '.join(p + '/' for p in RESERVED_PREFIXES)} and "
                             f"{', '.join(RESERVED_PATHS)}")


RESERVED_PATHS = ("/get_reward", "/verify", "/healthz", "/readyz", "/metrics", "/docs",
                  "/docs/oauth2-redirect", "/redoc", "/openapi.json")
"""The app's own routes outside the versioned API (tests/unit/test_compat_paths.py checks
that every route of the app is covered by these and :data:`RESERVED_PREFIXES`)."""
RESERVED_PREFIXES = ("/v1", "/ui")
"""The versioned API and the run inspector's page and files: every path under them is
rewardd's, today's routes and tomorrow's."""


def is_reserved(path: str) -> bool:
    """Whether ``path`` is (or may become) a route of rewardd itself; a trailing slash or a
    repeated one does not make it another path."""
    plain = "/" + "/".join(part for part in path.split("/") if part)
    return plain in RESERVED_PATHS or any(plain == prefix or plain.startswith(prefix + "/")
                                          for prefix in RESERVED_PREFIXES)


def _read(source: str) -> tuple[Any, str]:
    """(decoded document, where it came from) of the setting: inline JSON when it starts
    with ``{``, else a path to a .json, .yaml or .yml file."""
    text, origin = source, "inline JSON"
    if not source.lstrip().startswith("{"):
        path = Path(source)
        origin = f"file {str(path)!r}"
        try:  # a regular file of at most 16 MiB: /dev/zero was read for ever
            text = read_setting_text(path, "REWARDD_COMPAT_CONFIG")
        except SettingFileInvalid as exc:
            raise CompatConfigInvalid(str(exc)) from None
        if path.suffix in (".yaml", ".yml"):
            import yaml  # only for YAML files

            try:
                return yaml.safe_load(text), origin
            except yaml.YAMLError as exc:
                raise CompatConfigInvalid(f"REWARDD_COMPAT_CONFIG ({origin}): not valid "
                                          f"YAML: {exc}") from None
    try:
        return json.loads(text), origin
    except json.JSONDecodeError as exc:
        raise CompatConfigInvalid(f"REWARDD_COMPAT_CONFIG ({origin}): not valid JSON: "
                                  f"{exc}") from None


@lru_cache(maxsize=8)
def load_compat_config(source: str | None) -> CompatConfig:
    """The configuration the setting describes (defaults when unset); raises
    :class:`CompatConfigInvalid` naming the field and the reason."""
    if not source:
        return CompatConfig()
    data, origin = _read(source)
    if not isinstance(data, dict):
        raise CompatConfigInvalid(f"REWARDD_COMPAT_CONFIG ({origin}): expected an object, "
                                  f"got {type(data).__name__}")
    try:
        config = CompatConfig.model_validate(data)
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: "
                            f"{e['msg'].removeprefix('Value error, ')}"
                            for e in exc.errors()[:10])
        raise CompatConfigInvalid(f"REWARDD_COMPAT_CONFIG ({origin}): {reasons}") from None
    return config


def check_compat_config(config: CompatConfig, settings: Settings) -> None:
    """The components and advantage spec checked exactly as /v1/score checks them (verifier
    names and parameters, time limits, estimator and its parameters, the reference a label
    makes), on a one-sample probe; raises :class:`CompatConfigInvalid` naming the field.
    Needs the verifier plugins imported (:func:`validated_compat_config` does that first)."""
    advantage = (config.group.advantage if config.group and config.group.advantage
                 else AdvantageSpec(output="none"))
    probe = ScoreRequest(groups=[{"group_id": "probe", "reference": {},
                                  "rollouts": [{"rollout_id": "0", "completion": "",
                                                "num_tokens": 1}]}],
                         rewards=config.rewards, advantage=advantage)
    try:
        validate_score(probe, settings)
    except RequestInvalid as exc:
        where = {"rewards": "rewards", "advantage": "group.advantage"}
        reasons = "; ".join(
            ".".join([where.get(str(e["loc"][1]), str(e["loc"][1])), *map(str, e["loc"][2:])])
            + f": {e['msg']}" for e in exc.errors if len(e["loc"]) > 1
            and e["loc"][1] in where)
        if reasons:
            raise CompatConfigInvalid(f"REWARDD_COMPAT_CONFIG: {reasons}") from None


def validated_compat_config(settings: Settings) -> CompatConfig:
    """The settings' compat configuration, parsed and checked (plugins imported first, so
    their verifiers count); raises :class:`CompatConfigInvalid`. Run when the process's
    settings load (:func:`rewardd.service.environment.load_settings`: ``rewardd serve``
    refuses to start) and when an app is built (:class:`.scorer.CompatScorer`)."""
    for module in settings.plugin_modules:
        importlib.import_module(module)
    config = load_compat_config(settings.compat_config)
    check_compat_config(config, settings)
    return config
