"""Measure a training step: trace it on fake tensors, or run it on a real device.

Ground truth for the memory engine (issue #3). Importing this package is cheap; torch,
transformers and peft are imported inside the functions that need them:

- `fitcheck.measure.trace.trace_step`: exact tensor-level peaks per phase under FakeTensorMode.
- `fitcheck.measure.real.real_step`: the same step on cuda / mps / cpu with the allocator's counters.
- `fitcheck.measure.result.MeasuredStep`: the result both return.
"""
