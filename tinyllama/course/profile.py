"""Size profiles: every size a notebook uses, in one place.

The same notebook runs at full size on a GPU for the course (``gpu``) and at a tiny size on a
2-core CPU in CI (``ci``). The profile comes from the ``WORKSHOP_PROFILE`` environment variable;
without it, ``gpu`` is chosen when PyTorch sees a GPU and ``ci`` otherwise, and the notebook says so.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from tinyllama import device as dev

ENV_VARIABLE = "WORKSHOP_PROFILE"


@dataclass(frozen=True)
class Profile:
    """The sizes of one profile. Notebooks read their sizes from here and nowhere else."""

    name: str
    description: str
    # Timing: untimed warm-up calls and timed repetitions per measurement.
    warmup: int
    repeat: int
    # Ceilings (notebook 00, roofline): matrix size n of the n x n x n matmul, the sizes of the
    # matmul-size sweep, the precisions measured, and the bytes of the device-to-device copy.
    matmul_size: int
    matmul_sweep: tuple[int, ...]
    matmul_precisions: tuple[str, ...]
    copy_bytes: int
    # Device memory the full course needs, in GiB (below it notebook 00 warns).
    min_device_memory_gib: float
    # Inference benchmark (notebooks 01-07): torchvision network, batch size(s), image size, steps.
    inference_network: str
    inference_batch_size: int
    inference_batch_sizes: tuple[int, ...]
    image_size: int
    inference_steps: int
    # torch.compile modes notebook 06 compares with eager on the inference network (max-autotune's
    # autotuning costs minutes there: it is measured on the smaller case of autotune_network below).
    compile_modes: tuple[str, ...]
    # Kernel launches Nsight Compute profiles in notebook 07 (it replays each one: keep it small).
    vendor_launch_count: int
    # TinyLLaMA (V1-V4, kernels, roofline): preset of tinyllama.config, sweeps, training steps.
    tinyllama_preset: str
    tinyllama_batch_sizes: tuple[int, ...]
    tinyllama_seq_lens: tuple[int, ...]
    train_steps: int
    # 13_triton_basics: (rows, width) of the kernel checks (widths that are not powers of two), the
    # num_warps of the block-size sweep (empty: no sweep, interpreter timings mean nothing), the row
    # widths it sweeps, and the row counts of the launch-cost sweep (width: the preset's hidden size).
    triton_check_shapes: tuple[tuple[int, int], ...]
    triton_sweep_warps: tuple[int, ...]
    triton_sweep_widths: tuple[int, ...]
    triton_launch_rows: tuple[int, ...]
    # 14_flash_attention: batch of the attention measurements (heads and head size come from the
    # preset), sequence lengths of the correctness check (odd, crossing block edges), of the timing
    # sweep and of the memory sweep, and the sequence length of the memory prediction.
    attention_batch: int
    attention_check_seq_lens: tuple[int, ...]
    attention_seq_lens: tuple[int, ...]
    attention_memory_seq_lens: tuple[int, ...]
    attention_predict_seq: int
    # 10_tinyllama_baseline: the memory sweeps (batch sizes at the preset's sequence length, sequence
    # lengths at batch baseline_seq_batch) and the largest batch the out-of-memory search may try.
    baseline_batch_sizes: tuple[int, ...]
    baseline_seq_lens: tuple[int, ...]
    baseline_seq_batch: int
    baseline_oom_limit: int
    # 15_performance_debugging: training steps of the broken and the fixed run (the loss curves), the batch
    # they train on, and the steps the profiler records per stage (the interpreter makes each one slow on a CPU).
    debug_steps: int
    debug_batch_size: int
    debug_seq_len: int
    debug_profiled_steps: int
    # 18_roofline: launches Nsight Compute profiles of one V1 step, of the kernels that hold most of its device
    # time (a handful: it replays each one many times; the known GEMM has a short run of its own), and whether
    # V4 runs compiled (on two CPU cores its compile takes over a minute).
    roofline_ncu_launches: int
    roofline_compile_v4: bool
    roofline_profiled_steps: int  # steps the profiler records per version (after one warm-up step)
    # 16_sdpa_and_compile: training steps the profiler records per version (operators, launches); the
    # compile modes come from compile_modes (a CPU compiles one: its C++ kernels take gcc minutes).
    compile_profiled_steps: int
    # 17_version_comparison: batch and sequence of the comparison of V1-V4 (on a CPU the Triton interpreter
    # runs V3's kernels: one short sequence), and the timed steps of each run.
    versions_batch_size: int
    versions_seq_len: int
    versions_steps: int
    # 12_fusion and 17_version_comparison: rounds of timing in turns (two steps a run each) after each run's
    # own timing (tinyllama.harness.compare's turns), where the runs fit on the device at once. 12 times
    # more rounds: a fusion changes a step by a few percent, and the intervals of the fast steps' times
    # that decide it narrow with the samples (at 15 rounds the gate/up fusion's bf16 eager verdict still
    # differed between processes on one H200, at 30 it did not).
    compare_rounds: int
    fusion_rounds: int
    # 20_finetuning_lab: the model preset and bytes of standard-library text, optimizer steps per
    # configuration (timed; the loss after them is the convergence check) and untimed warm-up steps,
    # the learning rate, the sequence length and the shorter one of the sequence phase, the effective
    # batch (sequences per optimizer step) and the micro-batches tried at it, the loader workers
    # tried, the tolerance of the convergence check (relative, on the held-out loss), the batch of
    # the memory-estimate check, and the rounds of timing in turns (two steps each) that decide a phase.
    lab_preset: str
    lab_corpus_bytes: int
    lab_steps: int
    lab_warmup_steps: int
    lab_lr: float
    lab_seq_len: int
    lab_short_seq_len: int
    lab_effective_batch: int
    lab_micro_batches: tuple[int, ...]
    lab_workers: tuple[int, ...]
    lab_loss_tolerance: float
    lab_memory_batch: int
    lab_rounds: int
    # 22_generation: the model of the ladder (preset, version, precision), its prompt and new tokens per
    # sequence; the batch sweep's batches with its (short) prompt and new tokens, so that the weights, not the
    # cache, dominate a step's bytes; whether the ladder compiles the decode step (seconds on a GPU, minutes of
    # gcc on two CPU cores); warm-up and timed generations per configuration.
    generation_preset: str
    generation_version: str
    generation_precision: str
    generation_prompt_len: int
    generation_new_tokens: int
    generation_batches: tuple[int, ...]
    generation_sweep_prompt_len: int
    generation_sweep_new_tokens: int
    generation_compile: bool
    generation_warmup: int
    generation_repeat: int
    # 02_precision: the largest-batch search runs under a memory budget (a real limit on any device)
    precision_budget_mib: int
    precision_search_network: str
    precision_search_image_size: int
    # 06_torch_compile: the smaller case on which max-autotune is measured beside the other modes (its
    # autotuning of every convolution and fused kernel costs minutes at the inference network's size); an
    # empty network skips it (a CPU: its C++ GEMM templates and two cores would take many minutes).
    autotune_network: str
    autotune_batch_size: int
    autotune_modes: tuple[str, ...]
    compile_half_precision: bool  # also compile the network in half precision (a CPU: one cold compile too many)

    def as_dict(self) -> dict[str, object]:
        """All sizes by name (for a table in the notebook, or to stamp on a result)."""
        return asdict(self)


PROFILES: dict[str, Profile] = {
    "gpu": Profile(
        name="gpu",
        description="full course sizes, for one GPU of a JupyterHub node",
        warmup=5,
        repeat=20,
        matmul_size=8192,
        matmul_sweep=(256, 512, 1024, 2048, 4096, 8192),
        matmul_precisions=("fp32", "tf32", "bf16", "fp16"),
        copy_bytes=2**30,
        min_device_memory_gib=16.0,
        inference_network="resnet50",
        inference_batch_size=64,
        inference_batch_sizes=(1, 8, 32, 64, 128, 256),
        image_size=224,
        inference_steps=50,
        compile_modes=("default", "reduce-overhead"),  # max-autotune: see autotune_network (06)
        vendor_launch_count=60,
        tinyllama_preset="medium",
        tinyllama_batch_sizes=(4, 8, 16, 32),
        tinyllama_seq_lens=(128, 256, 512, 1024),
        train_steps=20,
        # 13_triton_basics
        triton_check_shapes=((3, 5), (7, 100), (33, 257), (4099, 1000)),
        triton_sweep_warps=(1, 2, 4, 8, 16),
        triton_sweep_widths=(1000, 4096, 8192),
        triton_launch_rows=(1, 16, 256, 4096, 32768, 262144),
        # 14_flash_attention
        attention_batch=2,
        attention_check_seq_lens=(1, 100, 257, 1000),
        attention_seq_lens=(512, 1024, 2048, 4096),
        attention_memory_seq_lens=(256, 512, 1024, 2048, 4096),  # math path at 4096: about 10 GiB at its peak
        attention_predict_seq=4096,
        # 10_tinyllama_baseline
        baseline_batch_sizes=(2, 4, 8, 16, 32),
        baseline_seq_lens=(128, 256, 512, 1024, 2048),
        baseline_seq_batch=4,
        baseline_oom_limit=512,
        # 15_performance_debugging
        debug_steps=30,
        debug_batch_size=16,
        debug_seq_len=512,
        debug_profiled_steps=3,
        # 18_roofline
        roofline_ncu_launches=30,
        roofline_compile_v4=True,
        roofline_profiled_steps=3,
        # 16_sdpa_and_compile
        compile_profiled_steps=3,
        # 17_version_comparison: the medium preset's own batch and sequence
        versions_batch_size=16,
        versions_seq_len=512,
        versions_steps=20,
        compare_rounds=15,
        fusion_rounds=30,
        # 20_finetuning_lab (about 10 configurations of the small model, each 100 steps)
        lab_preset="small",
        lab_corpus_bytes=8 * 2**20,
        lab_steps=100,
        lab_warmup_steps=3,
        lab_lr=1e-3,
        lab_seq_len=512,
        lab_short_seq_len=384,
        lab_effective_batch=16,
        lab_micro_batches=(2, 4, 8, 16),
        lab_workers=(0, 4),
        lab_loss_tolerance=0.03,
        lab_memory_batch=4,
        # 100 steps a configuration: at 40 (20 rounds) the p10's interval spanned ranks 1 to 8 and two runs
        # of one H200 machine kept different changes (2026-11-27).
        lab_rounds=50,
        # 22_generation: the medium model in bf16 with a 512-token prompt; the sweep up to batches where a
        # step's FLOPs per byte pass the ridge point (a 16-token context keeps the cache small)
        generation_preset="medium",
        generation_version="v2",
        generation_precision="bf16",
        generation_prompt_len=512,
        generation_new_tokens=64,
        generation_batches=(1, 8, 32, 128, 512, 1024, 2048),
        generation_sweep_prompt_len=16,
        generation_sweep_new_tokens=16,
        generation_compile=True,
        generation_warmup=2,
        generation_repeat=10,
        # 02_precision: ResNet-50 at 224 px in 4 GiB: a few hundred samples in fp32
        precision_budget_mib=4096,
        precision_search_network="resnet50",
        precision_search_image_size=224,
        # 06_torch_compile: ResNet-18 at batch 16 (about a minute or two of max-autotune on an H100/H200)
        autotune_network="resnet18",
        autotune_batch_size=16,
        autotune_modes=("default", "reduce-overhead", "max-autotune"),
        compile_half_precision=True,
    ),
    "ci": Profile(
        name="ci",
        description="tiny sizes for a CPU: about a minute per notebook in CI or on a laptop",
        warmup=1,
        repeat=3,
        matmul_size=256,
        matmul_sweep=(32, 64, 128, 256),
        matmul_precisions=("fp32", "bf16"),
        copy_bytes=2**24,
        min_device_memory_gib=0.0,
        inference_network="resnet18",
        inference_batch_size=2,
        inference_batch_sizes=(1, 2, 4),
        image_size=64,
        inference_steps=3,
        compile_modes=("default",),
        vendor_launch_count=20,
        tinyllama_preset="ci",
        tinyllama_batch_sizes=(1, 2),
        tinyllama_seq_lens=(16, 32),
        train_steps=2,
        # 13_triton_basics
        triton_check_shapes=((3, 5), (7, 100), (33, 257)),
        triton_sweep_warps=(),
        triton_sweep_widths=(),
        triton_launch_rows=(1, 9),
        # 14_flash_attention (Triton's interpreter: a forward at sequence 128 takes about 2 s)
        attention_batch=1,
        attention_check_seq_lens=(1, 37, 100),
        attention_seq_lens=(32, 64, 128, 256),
        attention_memory_seq_lens=(32, 64, 128),
        attention_predict_seq=128,
        # 10_tinyllama_baseline
        baseline_batch_sizes=(1, 2, 4, 8),
        baseline_seq_lens=(16, 32, 64, 128),
        baseline_seq_batch=2,
        baseline_oom_limit=16,
        # 15_performance_debugging: a sequence that is not a power of two, one batch row (interpreted kernels)
        debug_steps=3,
        debug_batch_size=1,
        debug_seq_len=12,
        debug_profiled_steps=1,
        # 18_roofline
        roofline_ncu_launches=10,
        roofline_compile_v4=False,
        roofline_profiled_steps=1,
        # 16_sdpa_and_compile
        compile_profiled_steps=1,
        # 17_version_comparison: one short sequence (interpreted kernels: V3's step takes seconds)
        versions_batch_size=1,
        versions_seq_len=12,
        versions_steps=2,
        compare_rounds=2,
        fusion_rounds=2,
        # 20_finetuning_lab: the ci model on 1 MiB of text, a few steps per configuration
        lab_preset="ci",
        lab_corpus_bytes=2**20,
        lab_steps=8,
        lab_warmup_steps=1,
        lab_lr=3e-3,
        lab_seq_len=64,
        lab_short_seq_len=48,
        lab_effective_batch=4,
        lab_micro_batches=(1, 2, 4),
        lab_workers=(0, 2),
        lab_loss_tolerance=0.05,
        lab_memory_batch=2,
        lab_rounds=10,
        # 22_generation: the ci model in fp32, short prompts, eager only (no CUDA graphs on a CPU)
        generation_preset="ci",
        generation_version="v2",
        generation_precision="fp32",
        generation_prompt_len=24,
        generation_new_tokens=12,
        generation_batches=(1, 4, 16, 64, 256),
        generation_sweep_prompt_len=8,
        generation_sweep_new_tokens=8,
        generation_compile=False,
        generation_warmup=1,
        generation_repeat=5,
        # 02_precision: SqueezeNet at 32 px in 6 MiB (its fp32 weights take 4.8): tens of samples, since
        # 16-bit convolutions are slow on most CPUs
        precision_budget_mib=6,
        precision_search_network="squeezenet1_0",
        precision_search_image_size=32,
        # 06_torch_compile: max-autotune skipped on a CPU
        autotune_network="",
        autotune_batch_size=0,
        autotune_modes=(),
        compile_half_precision=False,
    ),
}


@dataclass(frozen=True)
class Selection:
    """The chosen profile and why it was chosen (shown to the participant)."""

    profile: Profile
    reason: str

    def message(self) -> str:
        return f"Profile: {self.profile.name} ({self.profile.description}). {self.reason}"


def select_profile(requested: str | None = None) -> Selection:
    """Choose the profile: ``requested``, else ``$WORKSHOP_PROFILE``, else ``gpu`` when a GPU is
    present and ``ci`` otherwise.

    Raises ``ValueError`` for an unknown name and ``RuntimeError`` when ``gpu`` is asked for on a
    machine without a GPU (its sizes would take hours on a CPU).
    """
    source = "asked for"
    if requested is None:
        requested = os.environ.get(ENV_VARIABLE, "").strip() or None
        source = f"set by {ENV_VARIABLE}"
    has_gpu = dev.backend() != "cpu"
    if requested is None:
        if has_gpu:
            return Selection(PROFILES["gpu"], f"Chosen automatically: PyTorch sees a GPU "
                                              f"(set {ENV_VARIABLE}=ci for tiny sizes).")
        return Selection(PROFILES["ci"], "Chosen automatically: PyTorch sees no GPU, so every size is "
                                         f"tiny and the numbers say little about a GPU (set "
                                         f"{ENV_VARIABLE}=gpu on a GPU node).")
    name = requested.lower()
    if name not in PROFILES:
        raise ValueError(f"unknown workshop profile {requested!r}: set {ENV_VARIABLE} to one of "
                         f"{', '.join(PROFILES)} (or leave it unset to choose automatically)")
    if name == "gpu" and not has_gpu:
        raise RuntimeError(f"profile 'gpu' was {source} but PyTorch sees no GPU: run on a GPU node, or use "
                           f"the ci profile ({ENV_VARIABLE}=ci, or leave it unset) for the tiny CPU sizes")
    return Selection(PROFILES[name], f"Profile {source}.")


def get_profile(requested: str | None = None) -> Profile:
    """The active profile (see :func:`select_profile`)."""
    return select_profile(requested).profile
