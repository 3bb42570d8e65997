"""Profile where it leaves no residue: a call made in a fresh Python process.

After a profiler session, CUPTI (roctracer on ROCm) stays attached to the process, and every later
kernel launch there costs more; ``tinyllama.timing`` therefore refuses to time after one. A profile
that must be taken between timings (the GEMM counts of ``compare``, say) is taken here instead:

    result = isolated(count_gemms_of_runs, specs, preset, ...)

runs ``count_gemms_of_runs(specs, preset, ...)`` in ``python -m tinyllama.profiling.isolated``, a new
process on the same device, and returns what it returned. Arguments and result travel through
``torch.save`` files, so tensors, dataclasses and DataFrames cross; the function must be defined at
the top level of an importable module (a function typed into a notebook is not one).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from tinyllama.config import BenchmarkError


class IsolatedRunError(BenchmarkError):
    """The call failed in its process; the message is the error it raised there."""


def isolated(function: Callable[..., Any], /, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` called in a fresh Python process; its return value.

    Raises :class:`IsolatedRunError` with the error the call raised there (its last line, and the
    traceback's last frames), or when the process dies or outlives ``timeout_s`` seconds."""
    module, name = function.__module__, function.__qualname__
    if module == "__main__" or "<locals>" in name or "<lambda>" in name:
        raise ValueError(f"{name} cannot run in another process: only a function defined at the top level of an "
                         "importable module can (move it into a module of the package)")
    with tempfile.TemporaryDirectory(prefix="tinyllama-isolated-") as folder:
        request, answer = Path(folder) / "request.pt", Path(folder) / "answer.pt"
        torch.save({"module": module, "name": name, "args": args, "kwargs": kwargs}, request)
        env = dict(os.environ)
        # The caller's import path (a notebook kernel may have the checkout on it), so the function imports.
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")]).strip(os.pathsep)
        try:
            done = subprocess.run([sys.executable, "-m", "tinyllama.profiling.isolated", str(request), str(answer)],
                                  capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            raise IsolatedRunError(f"{name} did not finish within {timeout_s:.0f} s in its own process") from None
        if not answer.exists():
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-5:]
            raise IsolatedRunError(f"{name} died in its own process (exit code {done.returncode}): "
                                   + (" | ".join(tail) or "no output"))
        reply = torch.load(answer, weights_only=False)
    if "error" in reply:
        raise IsolatedRunError(f"{name} failed in its own process: {reply['error']}")
    return reply["result"]


def _serve(request: Path, answer: Path) -> None:
    job = torch.load(request, weights_only=False)
    try:
        target: Any = importlib.import_module(job["module"])
        for part in job["name"].split("."):
            target = getattr(target, part)
        reply = {"result": target(*job["args"], **job["kwargs"])}
    except Exception as error:  # noqa: BLE001 - every failure goes back to the caller as a message
        frames = "".join(traceback.format_exception(error)[-3:]).strip().replace("\n", " | ")
        reply = {"error": f"{type(error).__name__}: {error} ({frames})"}
    torch.save(reply, answer)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tinyllama.profiling.isolated REQUEST ANSWER``: the process :func:`isolated` starts."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m tinyllama.profiling.isolated REQUEST.pt ANSWER.pt (started by isolated())",
              file=sys.stderr)
        return 2
    _serve(Path(args[0]), Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
