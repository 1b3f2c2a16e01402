"""Hardware: what machine is this, what is in the catalog, and how much memory a training run may use.

Modules: ``env`` (the injectable view of the machine), ``parse`` (pure parsers of tool output),
``probes`` (detection, I/O only through ``env``), ``catalog`` (the device presets), ``budget``
(usable-memory rules, ``resolve_target``) and ``report`` (what ``fitcheck hw`` prints).
"""
