"""The checks of notebook 21 (distributed training): the per-GPU memory formula, the torchrun command
and the bytes each rank communicates, each compared with ``tinyllama.harness.distributed`` on cases that tell
the typical mistakes apart."""

from __future__ import annotations

from typing import Callable, Sequence

from tinyllama.course.checkpoints import checkpoint
from tinyllama.harness.distributed import communication_bytes, model_state_bytes

# (parameters, strategy, world size): a parameter count that does not split evenly included.
CASES: tuple[tuple[int, str, int], ...] = ((1_000_000, "ddp", 2), (1_000_000, "fsdp", 2), (1_000_003, "fsdp", 4),
                                           (5_000, "ddp", 8), (5_000, "fsdp", 8), (7_777, "ddp", 1))


def _explain_state(num: int, strategy: str, world: int, got: float) -> str:
    p = num
    slips = {"ddp": [(12 * p, "12 bytes a parameter: DDP's gradient buckets (4 more) are missing"),
                     (16 * p / world, "DDP does not shard: every rank keeps the whole model"),
                     (20 * p, "the gradients live inside DDP's buckets (gradient_as_bucket_view): count them once")],
            "fsdp": [(12 * p, "FSDP2 shards weights and optimizer state: divide by the world size"),
                     (16 * p / world, "FSDP2 keeps no gradient buckets between steps: 12 bytes a parameter, sharded"),
                     (4 * p / world, "AdamW keeps two moments per parameter (8 bytes) besides the weight")]}
    for value, why in slips[strategy]:
        if abs(got - value) <= 0.01 * value:
            return why
    return "weights 4 bytes, AdamW's two moments 8 bytes, DDP's buckets 4 bytes a parameter"


def check_state_formula(formula: Callable[[int, str, int], float], cases: Sequence[tuple[int, str, int]] = CASES) -> bool:
    """``formula(num_parameters, strategy, world_size)`` gives the bytes one rank keeps between steps."""
    wrong = []
    for num, strategy, world in cases:
        expected = sum(model_state_bytes(num, strategy, world).values())
        got = float(formula(num, strategy, world))
        if abs(got - expected) > max(16 * world, 1e-3 * expected):  # ceil or floor of a shard: both fine
            wrong.append(f"{strategy} on {world} ranks, {num:,} parameters: {got:,.0f} bytes, expected "
                         f"{expected:,.0f} ({_explain_state(num, strategy, world, got)})")
    return checkpoint(not wrong, f"the memory formula matches on {len(cases)} cases",
                      "the memory formula is off:\n  - " + "\n  - ".join(wrong))


def check_communication_formula(formula: Callable[[int, str, int], float],
                                cases: Sequence[tuple[int, str, int]] = CASES) -> bool:
    """``formula(num_parameters, strategy, world_size)`` gives the bytes one rank sends per step."""
    wrong = []
    for num, strategy, world in cases:
        expected = communication_bytes(num, strategy, world)
        got = float(formula(num, strategy, world))
        if abs(got - expected) > max(1.0, 1e-6 * expected):
            full = 4 * num
            hint = ("a ring collective sends (N-1)/N of the buffer per pass, not all of it"
                    if expected and abs(got - expected * world / (world - 1)) < 1e-6 * got + 1 else
                    "an all-reduce is two passes (reduce-scatter, all-gather); FSDP2 makes three "
                    "(all-gather forward, all-gather backward, reduce-scatter)" if got and expected else
                    "one rank alone sends nothing")
            wrong.append(f"{strategy} on {world} ranks, {num:,} parameters ({full:,} bytes of fp32): {got:,.0f} bytes, "
                         f"expected {expected:,.0f} ({hint})")
    return checkpoint(not wrong, f"the communication formula matches on {len(cases)} cases",
                      "the communication formula is off:\n  - " + "\n  - ".join(wrong))


def check_torchrun_command(argv: Sequence[str], processes: int, per_gpu_batch: int) -> bool:
    """``argv`` starts ``tinyllama.harness.distributed`` on ``processes`` processes with ``per_gpu_batch`` each."""
    argv = [str(a) for a in argv]
    problems = []
    if argv[1:3] != ["-m", "torch.distributed.run"]:
        problems.append("start it with the Python of this kernel and -m torch.distributed.run (what torchrun runs)")
    if "--nproc-per-node" not in argv or argv[argv.index("--nproc-per-node") + 1] != str(processes):
        problems.append(f"--nproc-per-node must be {processes}: one process per GPU")
    if "tinyllama.harness.distributed" not in argv or argv[argv.index("tinyllama.harness.distributed") - 1] != "-m":
        problems.append("run the module tinyllama.harness.distributed with -m")
    if "--batch-size" not in argv:
        problems.append("give --batch-size")
    elif int(argv[argv.index("--batch-size") + 1]) != processes * per_gpu_batch:
        problems.append(f"--batch-size is the global batch: {processes} x {per_gpu_batch} per GPU, "
                        f"not {argv[argv.index('--batch-size') + 1]}")
    if "--json" not in argv:
        problems.append("add --json FILE: the notebook reads every rank's record back from it")
    return checkpoint(not problems, "the torchrun command is right",
                      "the torchrun command:\n  - " + "\n  - ".join(problems))
