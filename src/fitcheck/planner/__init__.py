"""The planner: search the configurations that fit for the fastest one, and explain it.

Pure functions of frozen models (no I/O, no clock, no environment): `plan.make_plan` takes the model,
the target, the device's speed and the request. The command (`fitcheck.commands.plan`) resolves
those and renders the result; `fitcheck.emitters` turn the plan into trainer configs.
"""
