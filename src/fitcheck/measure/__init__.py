"""Measure a training step: trace it on fake tensors, or run it on a real device.

Ground truth for the memory engine (issue #3). Importing this package is cheap; torch,
transformers and peft are imported inside the functions that need them:

- `fitcheck.measure.trace.trace_step`: exact tensor-level peaks per phase under FakeTensorMode.
- `fitcheck.measure.real.real_step`: the same step on cuda / mps / cpu with the allocator's counters.
- `fitcheck.measure.diffusion.trace_denoiser_step`: the same for a diffusers UNet in kohya's step
  (`trace_module`, `attach_kohya_lora` for other denoisers: bench/calibrate_kohya_dit.py).
- `fitcheck.measure.result.MeasuredStep`: the result all of them return.

All torch lives in this package; the private torch/transformers internals the tracers need are in
`fitcheck.measure._internals` (checked versions there and in tests/test_measure_internals.py).
"""
