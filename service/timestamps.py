"""Times as the API shows them: unix seconds (what the stores keep) as RFC 3339 UTC.

Shared by jobs and sessions (``created_at``, ``started_at``, ``finished_at``), so both read
the same way."""

from __future__ import annotations

from datetime import datetime, timezone


def iso(t: float | None) -> str | None:
    """Unix seconds as RFC 3339 UTC (``2024-05-01T12:00:00.123456Z``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")
