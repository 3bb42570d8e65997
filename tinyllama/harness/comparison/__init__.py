"""The parts of ``tinyllama.harness.compare``, one job each:

- :mod:`~tinyllama.harness.comparison.runs`: run specs (``"v2[fuse_qkv=0]:bf16"``) and run sets;
- :mod:`~tinyllama.harness.comparison.parity`: the check against V1 (logits, loss, every gradient) before timing;
- :mod:`~tinyllama.harness.comparison.record`: the comparison record, its table, text, plot and files;
- :mod:`~tinyllama.harness.comparison.regressions`: a record against an earlier one, beyond the spread;
- :mod:`~tinyllama.harness.comparison.targets`: the GPU measurement's run list and targets;
- :mod:`~tinyllama.harness.comparison.fusions`: V2's fusions: run specs, and each fusion's effect against its control.
"""
