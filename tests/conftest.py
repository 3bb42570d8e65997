"""Shared test set-up: tests run on the CPU unless a GPU is present; Triton runs interpreted there.

``DEVICE`` (and the ``device`` fixture) is where tests run; tests that need a GPU carry
``@pytest.mark.gpu`` and are skipped without one."""

import os
import tempfile

import pytest

# Each test session compiles into empty Inductor and Triton caches of its own, never into one another run
# left: torch.compile's on-disk cache is not invalidated when a custom operator's registered backward
# changes, so a stale entry could hide a broken kernel or fail correct code. Set before torch is imported.
_SESSION_DIR = tempfile.mkdtemp(prefix="tinyllama-tests-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_SESSION_DIR, "inductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_SESSION_DIR, "triton")
# Tests must never write results into a user's real results directory.
os.environ["WORKSHOP_RESULTS_DIR"] = os.path.join(_SESSION_DIR, "results")

import torch  # noqa: E402

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"

# The Triton interpreter must be chosen before any kernel module is imported (the @triton.jit
# decorator reads it), so set it here, first, on machines without a GPU.
if not GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

os.environ.setdefault("WORKSHOP_PROFILE", "ci")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``gpu`` on a machine without one."""
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_profiler_record():
    """Each test starts as a fresh process would: no profiler session on record (the timers refuse to
    time after one, and tests of many modules share this process)."""
    from tinyllama.timing import forget_profiler_sessions

    forget_profiler_sessions()
    yield
    forget_profiler_sessions()


@pytest.fixture
def device() -> torch.device:
    """The device tests run on: the GPU where there is one, else the CPU."""
    return torch.device(DEVICE)


@pytest.fixture
def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks raise on a wrong answer (as under nbval in CI), so a test can expect the failure."""
    monkeypatch.setenv("WORKSHOP_STRICT", "1")


@pytest.fixture
def lenient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks print their verdict and go on, as in a participant's notebook."""
    monkeypatch.delenv("WORKSHOP_STRICT", raising=False)


def logits_and_grads(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward and backward of ``model``: its logits and every parameter's gradient under V1's
    names (fused gradients split into their parts), the gradients cleared again afterwards."""
    from tinyllama.models import lm_loss
    from tinyllama.models.weights import canonical_gradients

    model.zero_grad(set_to_none=True)
    logits = model(tokens)
    lm_loss(logits, tokens).backward()
    grads = canonical_gradients(model)
    model.zero_grad(set_to_none=True)
    return logits.detach(), grads
