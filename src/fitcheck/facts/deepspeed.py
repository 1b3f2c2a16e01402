"""DeepSpeed ZeRO's buffer defaults, in elements: what a config that names no value gets.

Source: deepspeed/runtime/zero/config.py, ``DeepSpeedZeroConfig`` field defaults (v0.12.3 @6ea44d02,
lines 104-209, unchanged through v0.19.8): ``reduce_bucket_size`` and ``allgather_bucket_size``
``pp_int(5e8)``, ``stage3_prefetch_bucket_size`` 5e7, ``stage3_param_persistence_threshold`` 1e5,
``stage3_max_live_parameters`` 1e9, ``stage3_max_reuse_distance`` 1e9 (line 215), ``sub_group_size`` 1e9.
Plain data (no pydantic): the engine and the readers both take them from here.
"""

from __future__ import annotations

ZERO_DEFAULTS: dict[str, int] = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
}
