"""The registry of verifier kinds: one name, one verifier, built-in or plugin.

It sits below every verifier (it imports only :mod:`~rewardd.verifiers.base`), so a verifier
that must know what the others document (the code verifier refuses a reference key that no
registered verifier documents) asks it here, instead of importing back the package that
imports the verifier. :mod:`rewardd.verifiers` fills it with the built-ins and re-exports it;
the service lists it at ``GET /v1/verifiers`` and the executor looks names up in it.
"""

from __future__ import annotations

from rewardd.verifiers.base import Verifier

REGISTRY: dict[str, Verifier] = {}


def register(verifier: Verifier) -> Verifier:
    """Add a verifier (for plugins named in REWARDD_PLUGINS); a name may be taken once."""
    if verifier.name in REGISTRY:
        raise ValueError(f"verifier {verifier.name!r} is already registered")
    REGISTRY[verifier.name] = verifier
    return verifier


def get_verifier(name: str) -> Verifier:
    """The verifier registered under ``name``; KeyError lists the valid names."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown verifier {name!r}; valid: {', '.join(sorted(REGISTRY))}") from None


def registered_fields() -> frozenset[str]:
    """The reference keys that any registered verifier documents (plugins included)."""
    return frozenset(key for v in REGISTRY.values() for key in v.reference_fields)


__all__ = ["REGISTRY", "get_verifier", "register", "registered_fields"]
