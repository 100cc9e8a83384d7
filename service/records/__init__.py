"""The run record: every scored rollout of a run, with its verdicts, kept in a database.

Written off the request path (:mod:`.writer`: a bounded queue and one writer thread), read by
the runs API, replay and the inspector. One small interface (:class:`.store.RecordStore`)
over SQLAlchemy Core, so the same code runs on a SQLite file (embedded: nothing to start) and
on PostgreSQL (shared by every API pod); the schema is created and upgraded by Alembic
migrations (:mod:`.migrate`) from the first version on.
"""
