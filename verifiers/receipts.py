"""Receipts: what a verdict was decided from, in a form that proves it later.

Every component verdict carries a receipt (``status.<component>.receipt``): the verifier's
name and ``revision``, a hash of its effective parameters (the validated parameters with
their defaults filled in, so ``{}`` and the defaults spelled out hash alike), hashes of the
group's reference and of the completion, the sandbox isolation a code verdict ran under, and
a judge's backend, model, temperature and seed. The same inputs give the same receipt on any
pod: hashes are over canonical JSON (sorted keys, no whitespace, UTF-8), never over Python
objects or process state.

The receipt's inputs are also the verdict cache's key (:meth:`CallStamp.cache_key`), with
the prompt and the token count beside the completion: a verifier may read both.

Hashes are BLAKE2b with a 16-byte digest (32 hex characters): collisions at 2^64 inputs,
far beyond any record, at half the bytes of SHA-256 on every status entry of every response.
Hand-written because it is a few lines over :mod:`hashlib` and :mod:`orjson`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson

from rewardd.verifiers.base import Outcome, Sample, Verifier

DIGEST_BYTES = 16


def digest_bytes(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON: sorted keys, no whitespace; what is not JSON (a tuple,
    a number type of another library) as JSON would write it, else its ``str``."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
                        | orjson.OPT_NON_STR_KEYS, default=str)


def digest(value: Any) -> str:
    """The hash of ``value`` as canonical JSON (a string hashes as its JSON string)."""
    return digest_bytes(canonical(value))


def text_digest(text: str) -> str:
    """The hash of a text's UTF-8 bytes (completions: no JSON escaping to pay for)."""
    return digest_bytes(text.encode("utf-8", "surrogatepass"))


def effective_params(verifier: Verifier, params: Mapping[str, Any]) -> Any:
    """The parameters the verifier decides with: validated, defaults filled in. Parameters
    the model refuses hash as they came (the verdict is then a typed failure anyway)."""
    try:
        return verifier.Params.model_validate(params).model_dump(mode="json")
    except Exception:  # the verdict says why; the receipt still names what was sent
        return dict(params)


JUDGE_PARAMS = ("temperature", "seed")
"""Sampling parameters a judge's receipt names beside its backend and model."""


@dataclass(frozen=True, slots=True)
class CallStamp:
    """The part of a receipt shared by every sample of one call (one verifier, params and
    reference): computed once per call, so a group of 16 hashes its reference once."""

    verifier: str
    revision: str
    params_hash: str
    reference_hash: str
    context_hash: str | None
    judge: Mapping[str, Any] | None
    cacheable: bool
    verifier_impl: Verifier | None = field(default=None, compare=False, repr=False)
    """The verifier itself, asked whether an outcome is repeatable (not part of a receipt)."""

    @classmethod
    def of(cls, verifier: Verifier, params: Mapping[str, Any], reference: Mapping[str, Any],
           context: Mapping[str, Any] | None = None) -> CallStamp:
        effective = effective_params(verifier, params)
        judge = None
        if verifier.judged and isinstance(effective, Mapping):
            judge = {key: effective.get(key) for key in JUDGE_PARAMS}
        return cls(verifier.name, verifier.revision, digest(effective), digest(reference),
                   digest(context) if context is not None else None, judge,
                   verifier.cacheable(effective), verifier)

    def receipt(self, sample: Sample, outcome: Outcome,
                completion_hash: str | None = None) -> dict[str, Any]:
        """The receipt of one sample's verdict (``completion_hash``: when already known)."""
        out: dict[str, Any] = {
            "verifier": self.verifier, "revision": self.revision,
            "params_hash": self.params_hash, "reference_hash": self.reference_hash,
            "completion_hash": completion_hash or text_digest(sample.completion)}
        isolation = outcome.detail.get("isolation")
        if isinstance(isolation, str):
            out["isolation"] = isolation
        if self.judge is not None:
            used = outcome.detail.get("judge")
            used = used if isinstance(used, Mapping) else {}
            out["judge"] = {"backend": used.get("backend"), "model": used.get("model"),
                            **self.judge}
        return out

    def keeps(self, outcome: Outcome) -> bool:
        """True when the cache may keep ``outcome``: a success (a timeout or an unavailable
        sandbox is about that moment, not the completion) its verifier calls repeatable
        (:meth:`~rewardd.verifiers.base.Verifier.repeatable`), and for an unseeded judge one
        decided without a retry (retries sample at a higher temperature)."""
        if not outcome.ok:
            return False
        if self.verifier_impl is not None and not self.verifier_impl.repeatable(outcome):
            return False
        if self.judge is None or self.judge.get("seed") is not None:
            return True
        used = outcome.detail.get("judge")
        return not (isinstance(used, Mapping) and used.get("retries"))

    def cache_key(self, sample: Sample, completion_hash: str) -> str | None:
        """The verdict cache's key for ``sample`` (None: this call's verdicts are never
        cached): every input a verdict may depend on, revision included, so an upgrade that
        changes verdicts never reads an old one."""
        if not self.cacheable:
            return None
        return digest((self.verifier, self.revision, self.params_hash, self.reference_hash,
                       self.context_hash, completion_hash, text_digest(sample.prompt),
                       sample.num_tokens))


__all__ = ["CallStamp", "canonical", "digest", "effective_params", "text_digest"]
