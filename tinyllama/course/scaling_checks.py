"""The checks of notebook 05 (data-parallel inference on several GPUs), with feedback that names the mistake.

- :func:`check_split`: the per-rank batch and the global throughput of a recorded run, from its ranks'
  median times (the slowest rank finishes the batch);
- :func:`check_efficiency_function`: a ``scaling_efficiency(global_throughput, baseline, k)`` on the recorded
  run and on made-up ones;
- :func:`check_allreduce`: the time of a ring all-reduce of a model's gradients at a (measured) bus bandwidth,
  and the efficiency a step would keep if that time were added to it;
- :func:`check_measured_efficiency`: the efficiencies the participant's function gives for this machine's runs
  against those the benchmark itself reported.

Besides: :func:`latency_verdict`, whether a small all-reduce reaches a lower bus bandwidth than a large one
beyond both timings' spreads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from inference.recorded import RecordedScaling
from tinyllama.course.checkpoints import (
    check_between,
    check_close,
    check_equal,
    checkpoint,
)
from tinyllama.course.feedback import slip_hint
from tinyllama.timing import Band, verdict


def split_slips(recorded: RecordedScaling) -> list[tuple[float, str]]:
    """Typical wrong global throughputs of exercise 05.1 computed from ``recorded``: (value, what it is)."""
    medians = recorded.per_rank["median_ms"]
    slowest = float(medians.max())
    return [
        (float(recorded.per_rank["throughput"].sum()),
         ("That is the sum of the ranks' own rates: the batch is done only when the slowest rank is, so divide "
         "the global batch by the slowest rank's time.")),
        (recorded.batch_size / (float(medians.min()) / 1e3),
         "That uses the fastest rank's time: the batch is done only when the slowest rank is."),
        (recorded.batch_size / (float(medians.mean()) / 1e3),
         "That uses the ranks' mean time: the batch is done only when the slowest rank is."),
        (recorded.batch_size / slowest, ("That divides by milliseconds: the medians are in ms, a rate is per second "
                                        "(1000x too small).")),
        (recorded.batch_size // recorded.world_size / (slowest / 1e3),
         ("That is one rank's rate (its share of the batch over its time): the run's rate counts the whole global "
         "batch.")),
        (recorded.batch_size * recorded.world_size / (slowest / 1e3),
         (f"That counts the global batch {recorded.world_size} times: --batch-size ({recorded.batch_size}) is already "
         "the batch of all ranks together.")),
    ]


def check_split(per_rank_batch: int, global_throughput: float, recorded: RecordedScaling) -> bool:
    """``per_rank_batch`` = global batch / world size; ``global_throughput`` = global batch over the slowest
    rank's median time (samples/s), within 0.01%: the sum of the ranks' own rates is close but not it. A
    wrong throughput is compared with :func:`split_slips` and the mistake it matches is named."""
    share = recorded.batch_size // recorded.world_size
    if per_rank_batch == recorded.batch_size:
        hint = (f"that is the global batch: --batch-size ({recorded.batch_size}) is shared by the "
                f"{recorded.world_size} ranks, each takes an equal part")
    elif per_rank_batch == recorded.batch_size * recorded.world_size:
        hint = (f"that multiplies by the ranks: --batch-size ({recorded.batch_size}) is already the global batch, "
                f"which the {recorded.world_size} ranks share")
    else:
        hint = (f"--batch-size is the global batch ({recorded.batch_size}): each of the {recorded.world_size} ranks "
                "takes an equal share")
    ok = check_equal("samples per rank", per_rank_batch, share, hint)
    medians = recorded.per_rank["median_ms"]
    expected = recorded.batch_size / (medians.max() / 1e3)
    value = float(global_throughput)
    hint = ""
    if not math.isclose(value, expected, rel_tol=1e-4):
        hint = next((text for slip, text in split_slips(recorded)
                     if math.isclose(value, slip, rel_tol=1e-6) and not math.isclose(slip, expected, rel_tol=1e-4)), "")
    ok &= check_between("global throughput", value, expected * (1 - 1e-4), expected * (1 + 1e-4),
                        "samples/s", hint=hint,
                        why=f"{recorded.batch_size} samples / {medians.max():.4g} ms (the slowest rank's median) = "
                            f"{expected:,.0f} samples/s; the recorded run printed {recorded.global_throughput:,.0f}.")
    return ok


def check_efficiency_function(scaling_efficiency: Callable[[float, float, int], float], recorded: RecordedScaling) -> bool:
    """``scaling_efficiency(global_throughput, baseline_throughput, k)`` = global / (k x baseline): on the
    recorded run (against the efficiency it recorded) and on made-up runs of 1 to 8 processes."""
    cases = [(float(recorded.global_throughput), float(recorded.baseline_throughput), recorded.world_size),
             (300.0, 100.0, 4), (100.0, 100.0, 1), (700.0, 100.0, 8), (90.0, 60.0, 2)]
    for g, b, k in cases:
        try:
            value = float(scaling_efficiency(g, b, k))
        except Exception as error:  # noqa: BLE001 - shown to the participant as feedback
            return checkpoint(False, "", f"scaling_efficiency({g:.6g}, {b:.6g}, {k}) raised {type(error).__name__}: {error}")
        expected = g / (k * b)
        if not math.isclose(value, expected, rel_tol=1e-9):
            hint = slip_hint(value, expected, [(float(k), "not divided by k: ideal is k times the one-GPU rate."),
                                               (100.0, "a percent: return the fraction (1.0 for ideal)."),
                                               (1.0 / expected ** 2, "the other way round: measured over ideal.")])
            return checkpoint(False, "", f"scaling_efficiency(global {g:.6g}, baseline {b:.6g}, k={k}) = {value:.4g}, "
                                         f"expected {expected:.4g} (measured global throughput / (k x baseline)). {hint}".rstrip())
    recorded_ok = recorded.scaling_efficiency is None or math.isclose(
        scaling_efficiency(*cases[0]), recorded.scaling_efficiency, rel_tol=1e-6)
    return checkpoint(recorded_ok, f"scaling_efficiency agrees with the recorded run ({recorded.scaling_efficiency:.4f}) "
                                   f"and {len(cases) - 1} made-up ones",
                      "scaling_efficiency differs from the efficiency the recorded run printed")


def ring_allreduce_ms(parameters: int, bytes_per_parameter: int, k: int, bus_gbs: float) -> float:
    """Milliseconds a ring all-reduce of ``parameters`` gradients takes on ``k`` GPUs: each GPU sends and
    receives ``2 (k - 1) / k`` times the gradient bytes, at ``bus_gbs`` GB/s (10^9 bytes/s)."""
    if k < 1 or parameters <= 0 or bus_gbs <= 0:
        raise ValueError(f"need k >= 1, parameters > 0 and a bandwidth > 0 (got k={k}, {parameters}, {bus_gbs} GB/s)")
    return 2 * (k - 1) / k * parameters * bytes_per_parameter / (bus_gbs * 1e9) * 1e3


def check_allreduce(allreduce_ms: float, exposed_efficiency: Callable[[float], float], parameters: int,
                    bytes_per_parameter: int, k: int, bus_gbs: float) -> bool:
    """``allreduce_ms`` against :func:`ring_allreduce_ms`, and ``exposed_efficiency(step_ms)`` = step /
    (step + all-reduce) at several step times."""
    expected = ring_allreduce_ms(parameters, bytes_per_parameter, k, bus_gbs)
    ring = 2 * (k - 1) / k
    ok = check_between("all-reduce time", float(allreduce_ms), 0.99 * expected, 1.01 * expected, "ms",
                       hint=slip_hint(float(allreduce_ms), expected,
                                      [(1 / ring, (f"without the ring's factor 2 (k-1)/k = {ring:.3g}: every GPU sends "
                                                  "its share out and receives the others' sums back.")),
                                       (1 / bytes_per_parameter, (f"the gradient count, not its bytes: each gradient "
                                                                 f"is {bytes_per_parameter} bytes.")),
                                       (2.0 / bytes_per_parameter, (f"as if each gradient were 2 bytes: these are "
                                                                   f"{bytes_per_parameter} bytes each.")),
                                       (1e3, "1000x: GB/s is 10^9 bytes per second, and the answer is in ms."),
                                       (1e-3, "1/1000: the answer is in milliseconds."),
                                       (8.0, "8x: bytes, not bits.")]),
                       why=f"2 x ({k}-1)/{k} x {parameters:,} x {bytes_per_parameter} bytes / {bus_gbs:g} GB/s.")
    for step_ms in (1.0, 10.0, 45.0):
        value = float(exposed_efficiency(step_ms))
        want = step_ms / (step_ms + expected)
        if not math.isclose(value, want, rel_tol=1e-3):
            hint = slip_hint(value, want, [(100.0, "a percent: return the fraction.")])
            return checkpoint(False, "", f"exposed_efficiency({step_ms:g} ms) = {value:.4g}, expected {want:.4g}: the "
                                         f"step alone over the step plus the all-reduce ({expected:.3g} ms). {hint}".rstrip())
    return ok & checkpoint(True, "exposed_efficiency is the step's share of step + all-reduce", "")


def check_measured_efficiency(efficiency: pd.Series, runs: pd.DataFrame) -> bool:
    """``efficiency`` (by world size, from the participant's ``scaling_efficiency``) against the
    ``scaling_efficiency`` that rank 0 of each multi-process run in ``runs`` reported, within 0.1%."""
    reported = runs[(runs["rank"] == 0) & (runs["world_size"] > 1)].set_index("world_size")["scaling_efficiency"]
    ok = True
    for k, package in reported.items():
        ok &= check_close(f"your efficiency on {k} processes against the package's", float(efficiency.loc[k]),
                          float(package), rel_tol=1e-3,
                          hint="scaling_efficiency must divide the global throughput by k x the baseline")
    return ok


def _ms_per_mib(row: pd.Series | dict) -> Band:
    """Rank 0's milliseconds per MiB of one all-reduce sweep row (``tinyllama.harness.allreduce``'s record):
    its median and p10-p90 band, each divided by the buffer's MiB, so sizes compare as bandwidths do."""
    timing, mib = row["rank0"], float(row["mib"])
    return Band(timing["median"] / mib, timing["p10"] / mib, timing["p90"] / mib)


def latency_verdict(small: pd.Series | dict, large: pd.Series | dict) -> tuple[float, str]:
    """Whether the ``small`` buffer's all-reduce reached a lower bus bandwidth than the ``large`` one's, two rows
    of an all-reduce sweep (with rank 0's timing under ``rank0``). Returns the small buffer's bus bandwidth as a
    share of the large one's (the slowest ranks' medians, as the sweep reports them) and ``"lower"`` where the
    small buffer took longer per MiB beyond both p10-p90 bands (``timing.verdict``), else ``"within noise"``;
    ``"higher"`` where it took less beyond both. One slow sample of a tiny all-reduce widens its band but
    cannot hide a bandwidth several times lower."""
    share = float(small["busbw_gbs"]) / float(large["busbw_gbs"])
    _, said = verdict(_ms_per_mib(large), _ms_per_mib(small))  # "slower": the small buffer's MiB take longer
    return share, {"slower": "lower", "faster": "higher"}.get(said, "within noise")
