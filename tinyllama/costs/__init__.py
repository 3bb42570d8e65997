"""What a training step must cost, before any profiler looks: its FLOPs (``flops``), the bytes and
arithmetic intensity of its kernels (``intensity``, ``kernel_costs``), its parameters and activations
(``anatomy``), its memory term by term (``memory_estimate``), and the measured ceilings of the device
they are set against (``ceilings``). Modules are imported one by one.
"""
