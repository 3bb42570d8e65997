"""Shared test set-up: tests run on the CPU unless a GPU is present; Triton runs interpreted there."""

import os

import torch

# The Triton interpreter must be chosen before any kernel module is imported (the @triton.jit
# decorator reads it), so set it here, first, on machines without a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests must never write results into a user's real results directory.
os.environ.setdefault("WORKSHOP_PROFILE", "ci")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
