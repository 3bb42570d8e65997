"""The harnesses: what runs a measurement from end to end and writes its record.

``bench`` one honest training-step benchmark; ``compare`` versions side by side in one process
(``comparison/`` holds its parts); ``kernel_bench`` and ``launch_costs`` the Triton kernels alone;
``sweep`` many training configurations into one table; ``distributed`` data-parallel training over
several processes (``process_group`` joins them, ``allreduce`` times the collective); ``generate``
text generation; ``records`` the results files (shared with ``inference``); ``cli`` the options every
command line shares. Modules are imported one by one: importing this package loads none of them.
"""

from tinyllama import lazy_exports

# What notebooks import from this package beyond the names above, and the module that holds each: imported on
# first use (tinyllama.lazy_exports), so importing the package stays cheap and a module can move with one line here.
_LAZY: dict[str, str] = {
    "run_benchmark": ".bench", "NoRoomForTurns": ".bench", "TurnRun": ".bench", "time_steps_in_turns": ".bench",
    "compare_versions": ".compare:compare",  # the function; ``compare`` is its module
    "check_parity": ".comparison.parity", "forward_backward": ".comparison.parity",
    "l2_relative_error": ".comparison.parity", "reference_answer": ".comparison.parity",
    "ZERO_PARTS": ".distributed", "communication_bytes": ".distributed", "fsdp_available": ".distributed",
    "gathered_bytes": ".distributed", "model_state_bytes": ".distributed", "run_distributed": ".distributed",
    "scaling_table": ".distributed", "zero_state_bytes": ".distributed",
    "time_pass": ".kernel_bench",
    "DistContext": ".process_group",
    "load_json": ".records", "packaged_record": ".records", "unique_path": ".records",
    "RunConfig": ".sweep", "STATUS_OK": ".sweep", "compare_with": ".sweep", "run_sweep": ".sweep",
    "step_band": ".sweep",
}
__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
