"""Alembic's environment for the record: always online, on the connection
:func:`rewardd.service.records.migrate.upgrade` hands over (no alembic.ini, no URL here)."""

from alembic import context

from rewardd.service.records.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
