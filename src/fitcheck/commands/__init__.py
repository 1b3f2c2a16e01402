"""CLI commands that live in their own modules; each exposes `register(app)`."""
