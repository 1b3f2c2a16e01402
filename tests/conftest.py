"""Shared fixtures: small architectures and setups for property tests."""

from __future__ import annotations

import os

from hypothesis import settings

# ci: deterministic (derandomized) so a red CI always means a real regression; thorough: a long
# random search to run by hand before changing the engine (HYPOTHESIS_PROFILE=thorough).
settings.register_profile("ci", max_examples=150, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("thorough", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
