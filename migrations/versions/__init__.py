"""Alembic revisions, oldest first (Alembic loads them by path; this file makes them ship)."""
