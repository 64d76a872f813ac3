"""Integrations with other libraries (SQLAlchemy transactions, ASGI servers)."""
