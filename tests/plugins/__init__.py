"""Verifier plugins used by the tests (loaded through REWARDD_PLUGINS, like a user's own)."""
