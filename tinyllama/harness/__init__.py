"""The harnesses: what runs a measurement from end to end and writes its record.

``bench`` one honest training-step benchmark; ``compare`` versions side by side in one process
(``comparison/`` holds its parts); ``kernel_bench`` and ``launch_costs`` the Triton kernels alone;
``sweep`` many training configurations into one table; ``distributed`` data-parallel training over
several processes (``process_group`` joins them, ``allreduce`` times the collective); ``generate``
text generation; ``records`` the results files (shared with ``inference``); ``cli`` the options every
command line shares. Modules are imported one by one: importing this package loads none of them.
"""
