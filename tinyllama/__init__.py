"""TinyLLaMA: a LLaMA-style decoder in four ever faster versions, with the tools to measure them.

``models/`` the versions (V1's class declares the contract the harnesses read); ``kernels/`` the
Triton kernels; ``training`` the timed training step; ``bench`` and ``compare`` the two harnesses
(``comparison/`` holds the comparison's parts); ``profiling/`` the instruments; ``intensity`` the FLOPs
and bytes of the model's kernels from their shapes; ``records`` the
results files (shared with ``inference``); ``settings``, ``config``, ``device``, ``timing``, ``cli``
what they all share; ``data`` real text to train on, ``memory_estimate`` a step's memory term by term,
``sweep`` many training configurations into one table; ``course/`` the notebooks' infrastructure.
"""

__version__ = "0.1.0"
