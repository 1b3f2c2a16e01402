"""Tables of facts, one module per kind (dtypes, optimizers, runtime context sizes), each row sourced.

The engine, the diffusion simulator, the hardware budget and the planner read these; nothing here
imports from them, so `hardware` and `render` need nothing from `engine`.
"""
