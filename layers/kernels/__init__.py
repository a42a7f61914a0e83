"""Attention kernels behind one signature: attend(q, k, v, layout, prefix_kv=None) -> out.

Each kernel lives in its own module and registers in `KERNELS`; `get_kernel(name, options)`
returns a callable with the options (block sizes, interpret mode, limits) bound.
"""

from layers.kernels.base import KernelOptions, PrefixKV, SegmentLayout, get_kernel, kernel_names

__all__ = ["KernelOptions", "PrefixKV", "SegmentLayout", "get_kernel", "kernel_names"]
