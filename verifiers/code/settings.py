"""The operator's ceilings on what one code request may ask of the sandbox.

A request's ``params`` (``memory_mb``, ``processes``, ``cpu_s``, ``wall_s``) choose a run's
limits; these settings bound them, so no tenant can ask for 16 GiB and 1024 processes on a
shared worker. A request may lower a limit, never raise it: a value above the ceiling is a
422 naming the parameter and the ceiling (validated with the verifier's params, in the API
before anything runs and again in the worker), never silently clamped, because a clamped
limit grades a different contest than the one the trainer asked for. A built-in default
above a ceiling the operator lowered becomes the ceiling (the request asked for nothing).

They live here, in the verifier layer, because the sandbox's own parameter model needs them
and the layers import downward only; :class:`rewardd.workers.settings.WorkerSettings` extends
this class, so every process reads them from one settings object (env ``REWARDD_*`` or the
CLI flags, which the CLI exports to the environment).
"""

from __future__ import annotations

import functools
import os
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class SandboxSettings(BaseSettings):
    """Ceilings of the code sandbox. Descriptions double as the CLI help."""

    model_config = SettingsConfigDict(env_prefix="REWARDD_", extra="ignore")

    sandbox_max_memory_mb: int = Field(
        2048, ge=32, le=16384, description="Most memory (MiB) a code request may give one "
        "run: all of its processes together, and each process's address space. A request's "
        "`memory_mb` above it is refused (422).")
    sandbox_max_processes: int = Field(
        64, ge=1, le=1024, description="Most processes and threads a code request may give "
        "one run. A request's `processes` above it is refused (422).")
    sandbox_max_time_s: float = Field(
        30.0, gt=0, le=120, description="Most CPU seconds and most wall-clock seconds a code "
        "request may give one test. A request's `cpu_s` or `wall_s` above it is refused "
        "(422).")
    sandbox_unsafe: bool = Field(
        False, description="Run code without isolation where the machine cannot isolate it "
        "(no bubblewrap or no user namespaces): rlimits and seccomp only. For a developer's "
        "laptop; never on shared infrastructure.")
    sandbox_require_isolation: Literal["namespaces", "full"] | None = Field(
        None, description="The least isolation code may run under: `full` (namespaces and a "
        "per-run uid: the service runs as root) or `namespaces`. A machine that offers less "
        "runs no code: every check is `unavailable`, saying what the machine offers and "
        "what was required (canaries flag it in the first batch). Unset: whatever the "
        "machine offers (none only with REWARDD_SANDBOX_UNSAFE).")
    sandbox_include_dir: str | None = Field(
        None, description="A host directory of C/C++ headers that every C++ compilation in "
        "the sandbox sees read-only on its include path (shown at /opt/rewardd/include): put "
        "testlib.h there for testlib checkers such as CodeContests+'s. It must be readable "
        "by any user (the compiler runs as the run's own uid). Unset: none.")

    # --- issue 28: untrusted code is parsed only inside the sandbox
    sandbox_parse_memory_mb: int = Field(
        1024, ge=64, le=16384, description="Memory (MiB) of the sandbox run that reads a "
        "reference's assert-style `test_code` (parsing Python takes ~600 bytes per byte of "
        "code): test code whose parsing needs more is `invalid_reference`. Protects the "
        "worker, which never parses it itself. At most REWARDD_SANDBOX_MAX_MEMORY_MB.")

    @field_validator("sandbox_include_dir")
    @classmethod
    def _a_directory(cls, value: str | None) -> str | None:
        """A directory that is not there would make every testlib checker a compile error,
        far from its cause: refused when the settings are read."""
        if value in (None, ""):
            return None
        path = os.path.realpath(value)
        if not os.path.isdir(path):
            raise ValueError(f"{value!r} is not a directory")
        return path


@functools.lru_cache(maxsize=1)
def sandbox_settings() -> SandboxSettings:
    """The ceilings, read once per process (``sandbox_settings.cache_clear()`` re-reads)."""
    return SandboxSettings()
