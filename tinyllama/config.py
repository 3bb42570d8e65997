"""What a run is asked to do: the model's shape (``ModelConfig`` and the workshop's problem sizes), the
precisions and ``torch.compile`` modes every harness shares (TinyLLaMA's and the inference benchmark's), and the
errors a bad setting raises (the command lines print them as one line, without a traceback)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch


class BenchmarkError(RuntimeError):
    """A benchmark that cannot run as asked; the message says what to change."""


class ConfigError(BenchmarkError, ValueError):
    """A bad setting, found before anything is built."""


# fp32 is real fp32 (TF32 off); tf32 lets fp32 matmuls use TF32 tensor cores; bf16 and fp16 are
# autocast with fp32 weights.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
# The dtype a tensor of each precision is stored in (tf32 is fp32 storage, rounded inside the matmul).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# The modes that replay each compiled block as a CUDA (HIP) graph: one launch instead of dozens.
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def check_precision(precision: str) -> None:
    """Raise ``ValueError`` unless ``precision`` is one of ``PRECISIONS``."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(PRECISIONS)}")


def set_matmul_precision(precision: str) -> None:
    """fp32 means real fp32 (TF32 off); tf32 lets fp32 matmuls use TF32 tensor cores."""
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision for bf16/fp16 (weights stay fp32); nothing for fp32/tf32."""
    if precision in ("bf16", "fp16"):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a TinyLLaMA decoder.

    ``num_kv_heads < num_heads`` gives grouped-query attention: each key/value head serves
    ``num_heads // num_kv_heads`` query heads.
    """

    vocab_size: int = 1000
    hidden_dim: int = 256
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    intermediate_dim: int = 512
    max_seq_len: int = 1024
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_dim", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_dim", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.hidden_dim % self.num_heads:
            raise ValueError(
                f"hidden_dim {self.hidden_dim} is not divisible by num_heads {self.num_heads}: "
                "choose a hidden size that is a multiple of the number of heads"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.num_kv_heads}: "
                "each key/value head must serve the same number of query heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_dim // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def num_parameters(self) -> int:
        """Parameter count, from the shapes alone (embedding, layers, final norm, output head)."""
        h, i = self.hidden_dim, self.intermediate_dim
        attention = h * h * 2 + h * self.kv_dim * 2  # q, o and k, v projections
        mlp = 3 * h * i  # gate, up, down
        norms = 2 * h
        return self.vocab_size * h * 2 + self.num_layers * (attention + mlp + norms) + h

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """A named problem size: model shape plus default batch size and sequence length."""

    model: ModelConfig
    batch_size: int
    seq_len: int
    description: str = ""
    extra: dict[str, object] = field(default_factory=dict)


# The original workshop's sizes (tiny .. large), with grouped-query attention (half as many K/V
# heads as query heads), plus `ci`: small enough that a CPU runs a training step in well under a
# second, yet every shape (GQA, several layers, non-trivial head_dim) is still exercised.
PRESETS: dict[str, Preset] = {
    "ci": Preset(ModelConfig(vocab_size=128, hidden_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
                             intermediate_dim=160, max_seq_len=128), batch_size=2, seq_len=32,
                 description="CPU-sized, for tests and CI"),
    "tiny": Preset(ModelConfig(vocab_size=1000, hidden_dim=256, num_layers=4, num_heads=8, num_kv_heads=4,
                               intermediate_dim=512, max_seq_len=1024), batch_size=8, seq_len=128,
                   description="quick start"),
    "small": Preset(ModelConfig(vocab_size=1000, hidden_dim=512, num_layers=8, num_heads=8, num_kv_heads=4,
                                intermediate_dim=1024, max_seq_len=1024), batch_size=8, seq_len=256,
                    description="laptop GPU"),
    "medium": Preset(ModelConfig(vocab_size=1000, hidden_dim=1024, num_layers=12, num_heads=8,
                                 num_kv_heads=4, intermediate_dim=4096, max_seq_len=2048),
                     batch_size=16, seq_len=512, description="the workshop's reference size"),
    "large": Preset(ModelConfig(vocab_size=1000, hidden_dim=2048, num_layers=16, num_heads=16,
                                num_kv_heads=8, intermediate_dim=8192, max_seq_len=4096),
                    batch_size=8, seq_len=1024, description="a large GPU"),
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; a one-line error naming the choices otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None


def make_config(preset: str = "tiny", **overrides: int | float | None) -> ModelConfig:
    """The model shape of ``preset`` with the given fields replaced (``None`` values are ignored)."""
    config = get_preset(preset).model
    changes = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(changes) - set(config.to_dict())
    if unknown:
        raise ValueError(f"unknown model settings {sorted(unknown)}: choose from {sorted(config.to_dict())}")
    return replace(config, **changes)


def resolve_config(
    preset: str, batch_size: int | None, seq_len: int | None, **overrides: Any
) -> tuple[ModelConfig, int, int]:
    """The model shape, batch size and sequence length of a run: the preset's, with overrides."""
    chosen = get_preset(preset)
    batch_size = chosen.batch_size if batch_size is None else batch_size
    seq_len = chosen.seq_len if seq_len is None else seq_len
    if batch_size < 1 or seq_len < 1:
        raise ValueError(f"batch size and sequence length must be at least 1 (got {batch_size}, {seq_len})")
    if seq_len > chosen.model.max_seq_len and overrides.get("max_seq_len") is None:
        overrides["max_seq_len"] = seq_len
    return make_config(preset, **overrides), batch_size, seq_len
