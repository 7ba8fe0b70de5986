"""Alembic's environment and revisions (read by pipetune.service.migrate)."""
