"""Settings that fail fast: every ``REWARDD_*`` variable is a known setting with a valid value,
or the process does not start.

A misspelled variable (``REWARDD_POOL_SIZ=4``) used to be ignored, and the operator learned
of it from a pool of the wrong size in production; a bad value (``REWARDD_LOG_LEVEL=verbose``)
crashed far from its cause. :func:`load_settings` checks the environment when ``rewardd
serve``, ``worker`` or ``score`` starts and raises :class:`ConfigError` with one line per bad
variable, naming it, its value and the reason (for an unknown name, the nearest known one):
the CLI prints the lines and exits 2, no traceback. The same goes for what the settings name:
the key ring (a key given to two tenants), the compat configuration, and the files they
point at (read only when regular and at most 16 MiB: :mod:`rewardd.service.setting_files`).

What counts as known:

* every field of :class:`~rewardd.service.settings.Settings`, as ``REWARDD_<FIELD>`` (or the
  ``REWARDD_*`` names of its aliases);
* :data:`CLIENT_VARIABLES`: the rewardd client library's variables, which a trainer and a
  server started from the same shell share;
* the names listed in ``REWARDD_ALLOW_UNKNOWN`` (comma-separated), or every name when it is
  ``1``/``true``: the escape hatch for deliberate extras (a wrapper script's own variables).

Test harnesses (``REWARDD_TRL_PYTHON``, ``REWARDD_PARITY_REPORT``...) are not listed: they
configure the test process, and every server or worker a test starts gets an environment
without ``REWARDD_*`` variables (``tests/support/server.py:child_env``) plus the settings it
is meant to have. The check runs in the CLI only, so code that builds ``Settings`` in a
process of its own (tests, notebooks) is not refused for its environment.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Mapping

from pydantic import AliasChoices, ValidationError

from rewardd.service.compat.config import CompatConfigInvalid, validated_compat_config
from rewardd.service.settings import Settings
from rewardd.service.tenancy import KeysInvalid, load_keys

PREFIX = "REWARDD_"
ALLOW_VARIABLE = "REWARDD_ALLOW_UNKNOWN"
CLIENT_VARIABLES = frozenset({"REWARDD_URL", "REWARDD_REWARDS", "REWARDD_ADVANTAGE"})
"""Read by ``rewardd_client`` (clients/python), never by the server."""
SECRET_HINTS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
"""A value of a variable whose name holds one of these is not echoed in an error."""


class ConfigError(ValueError):
    """The environment holds unknown or invalid settings; ``lines`` has one per variable."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines


def variables_of(name: str, settings_cls: type[Settings] = Settings) -> list[str]:
    """The ``REWARDD_*`` variables that set field ``name``."""
    alias = settings_cls.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices if str(c).upper().startswith(PREFIX)]
    if isinstance(alias, str):
        return [alias.upper()]
    return [f"{PREFIX}{name.upper()}"]


def known_variables(settings_cls: type[Settings] = Settings) -> set[str]:
    """Every ``REWARDD_*`` name a rewardd process may meet in its environment."""
    names = {v.upper() for field in settings_cls.model_fields for v in variables_of(field,
                                                                                     settings_cls)}
    return names | CLIENT_VARIABLES


def unknown_variables(environ: Mapping[str, str],
                      settings_cls: type[Settings] = Settings) -> list[str]:
    """One line per ``REWARDD_*`` variable that is no setting and is not allowed."""
    allowed_text = environ.get(ALLOW_VARIABLE, "").strip()
    if allowed_text.lower() in ("1", "true", "yes", "on"):
        return []
    allowed = {a.strip().upper() for a in allowed_text.split(",") if a.strip()}
    known = known_variables(settings_cls)
    settings_names = sorted(known - CLIENT_VARIABLES)
    lines = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in known or upper in allowed:
            continue
        near = difflib.get_close_matches(upper, settings_names, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        lines.append(f"{name}: not a rewardd setting; {hint}(a deliberate extra: add it to "
                     f"{ALLOW_VARIABLE})")
    return lines


def shown(variable: str, value: Any) -> str:
    """``value`` as an error line shows it: secrets masked, long values cut."""
    if any(hint in variable.upper() for hint in SECRET_HINTS):
        return "<hidden>"
    text = str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def reason(error: Mapping[str, Any]) -> str:
    """pydantic's message, reworded where it reads poorly in a one-line error."""
    if error["type"] == "literal_error":
        return f"must be one of {error['ctx']['expected'].replace(chr(39), '')}"
    msg = str(error["msg"])
    msg = msg.removeprefix("Value error, ")
    return msg[:1].lower() + msg[1:] if msg[1:2].islower() else msg


def invalid_values(exc: ValidationError, environ: Mapping[str, str],
                   settings_cls: type[Settings] = Settings) -> list[str]:
    """One line per bad value: ``REWARDD_LOG_LEVEL=verbose: must be one of ...``."""
    lines = []
    for error in exc.errors():
        loc = error["loc"]
        if not loc or loc[0] not in settings_cls.model_fields:  # a check across settings
            lines.append(reason(error))
            continue
        names = variables_of(str(loc[0]), settings_cls)
        variable = next((n for n in names if n in environ), names[0])
        value = environ.get(variable, error.get("input"))
        lines.append(f"{variable}={shown(variable, value)}: {reason(error)}")
    return lines


def load_settings(settings_cls: type[Settings] = Settings) -> Settings:
    """The settings of the process environment, or :class:`ConfigError` listing every
    unknown variable and every bad value."""
    environ = dict(os.environ)
    lines = unknown_variables(environ, settings_cls)
    try:
        settings = settings_cls()
    except ValidationError as exc:
        raise ConfigError(lines + invalid_values(exc, environ, settings_cls)) from None
    if lines:
        raise ConfigError(lines)
    try:  # the key ring: a key given to two tenants, a key file that cannot be read
        load_keys(settings)
    except KeysInvalid as exc:
        raise ConfigError([str(exc)]) from None
    if settings.compat_config:  # the components a trainer protocol will run
        try:
            validated_compat_config(settings)
        except CompatConfigInvalid as exc:
            raise ConfigError([str(exc)]) from None
    return settings
