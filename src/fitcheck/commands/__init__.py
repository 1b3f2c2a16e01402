"""Typer command groups; each module exposes ``register(app)`` and imports its core lazily."""
