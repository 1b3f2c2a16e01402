"""Emitters: plan -> files a trainer accepts, one module per target, registered by name."""

from __future__ import annotations

#: emitter name -> "module:function"; imported lazily so the registry costs nothing at start-up.
EMITTERS: dict[str, str] = {"kohya": "fitcheck.emitters.kohya:emit_kohya"}
