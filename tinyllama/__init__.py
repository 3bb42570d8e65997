"""TinyLLaMA: a LLaMA-style decoder in four ever faster versions, with the tools to measure them.

Read the spine first, top to bottom:

- ``config``: the model's shape, the problem sizes, precisions and compile modes, the errors of a bad setting;
- ``models/``: the four versions (V1's class declares the contract the harnesses read);
- ``kernels/``: the Triton kernels of V3, each beside its launcher, autograd Function and reference;
- ``training``: the training step every harness times; ``data``: real text to train on;
- ``timing``: honest timing of device work and the verdicts drawn from it;
- ``correctness``: the checks that run before anything is timed;
- ``device``: everything that depends on the GPU vendor.

Then the folders built on it, each importing only what lies above it in this list:

- ``costs/``: what a step must cost on paper (FLOPs, bytes, memory) and the device's measured ceilings;
- ``profiling/``: the instruments (torch.profiler, vendor profilers, the roofline);
- ``generation/``: text generation with a KV cache;
- ``harness/``: the command lines that run a measurement end to end and write its record;
- ``course/``: the notebooks' machinery (checks, records of a participant's runs, the generator).
"""

__version__ = "0.1.0"
