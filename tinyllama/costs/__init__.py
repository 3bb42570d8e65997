"""What a training step must cost, before any profiler looks: its FLOPs (``flops``), the bytes and
arithmetic intensity of its kernels (``intensity``, ``kernel_costs``), its parameters and activations
(``anatomy``), its memory term by term (``memory_estimate``), and the measured ceilings of the device
they are set against (``ceilings``). Modules are imported one by one.
"""

from tinyllama import lazy_exports

# What notebooks import from this package beyond the names above, and the module that holds each: imported on
# first use (tinyllama.lazy_exports), so importing the package stays cheap and a module can move with one line here.
_LAZY: dict[str, str] = {
    "host_us_per_call": ".kernel_costs",
    "CHECKPOINT_TERM": ".memory_estimate", "block_terms": ".memory_estimate", "compare_terms": ".memory_estimate",
    "estimate_memory": ".memory_estimate", "measure_activation_terms": ".memory_estimate",
    "model_layout": ".memory_estimate",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
