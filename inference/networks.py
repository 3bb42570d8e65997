"""The torchvision networks the benchmark builds, each with random weights and its own input size.

Every classification, segmentation and detection model that the installed torchvision can build is
offered; nothing is ever downloaded (``weights=None`` and ``weights_backbone=None``). The input size
is the one the network is made for: the crop size of its default ImageNet weights for classification
(224 for ResNet-50, 299 for Inception v3, 600 for EfficientNet-B7), the fixed size of models that
only take one (ViT, MaxViT), 520 for segmentation, and the detector's own resize target (800 for
Faster R-CNN, 320 for SSDlite).
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Any, Union

import torch
import torch.nn.functional as F
from torch import nn
from torchvision import models

from inference.config import BenchmarkError

TASKS = ("classification", "segmentation", "detection")
_TASK_MODULES = {"classification": models, "segmentation": models.segmentation, "detection": models.detection}
_NUM_CLASSES = {"classification": 1000, "segmentation": 21, "detection": 91}
_SEGMENTATION_SIZE = 520  # torchvision's segmentation weights are evaluated at 520 x 520
_OBJECTS_PER_IMAGE = 3  # boxes in each random detection target

# Names that the original micro_benchmarking_pytorch.py accepted, so its commands keep working.
ALIASES = {
    "resnext50": "resnext50_32x4d",
    "resnext101": "resnext101_32x8d",
    "SqueezeNet": "squeezenet1_0",
    "SqueezeNet1.1": "squeezenet1_1",
    "shufflenet_v2_x05": "shufflenet_v2_x0_5",
    "shufflenet_v2_x10": "shufflenet_v2_x1_0",
    "shufflenet_v2_x15": "shufflenet_v2_x1_5",
    "shufflenet_v2_x20": "shufflenet_v2_x2_0",
}

Inputs = Union[torch.Tensor, list[torch.Tensor]]


class UnknownNetworkError(BenchmarkError):
    """The name is not a network this torchvision builds; carries the closest names."""

    def __init__(self, name: str, suggestions: list[str]) -> None:
        self.name = name
        self.suggestions = suggestions
        hint = f"; closest: {', '.join(suggestions)}" if suggestions else ""
        super().__init__(f"unknown network {name!r}{hint} (python -m inference --list shows them all)")


@dataclass(frozen=True)
class NetworkSpec:
    """A network's name, task, input size (height = width) and number of classes."""

    name: str
    task: str
    input_size: int
    num_classes: int


@functools.lru_cache(maxsize=1)
def _catalogue() -> dict[str, NetworkSpec]:
    catalogue: dict[str, NetworkSpec] = {}
    for task, module in _TASK_MODULES.items():
        for name in models.list_models(module=module):
            catalogue[name] = NetworkSpec(name, task, _input_size(name, task), _NUM_CLASSES[task])
    return catalogue


def _input_size(name: str, task: str) -> int:
    if task == "segmentation":
        return _SEGMENTATION_SIZE
    if task == "detection":
        # The detector resizes every image to its min_size; feeding that size makes the resize a no-op.
        # A model on the meta device is built without memory or initialisation (else on the CPU).
        try:
            with torch.device("meta"):
                model = models.get_model(name, weights=None, weights_backbone=None)
        except Exception:
            model = models.get_model(name, weights=None, weights_backbone=None)
        return int(model.transform.min_size[-1])
    weights = models.get_model_weights(name)
    default = weights.DEFAULT
    crop = int(default.transforms().crop_size[0])
    fixed = default.meta.get("min_size")
    if fixed and tuple(fixed) == (crop, crop):
        # A model that takes only one size (ViT, MaxViT). Built without weights it is made for the
        # smallest size any of its weights use (vit_h_14: 224, although its default weights use 518).
        return min(int(w.meta["min_size"][0]) for w in weights)
    return crop


def list_networks(task: str | None = None) -> list[NetworkSpec]:
    """All networks (or those of one ``task``), sorted by task then name."""
    specs = sorted(_catalogue().values(), key=lambda s: (TASKS.index(s.task), s.name))
    return [s for s in specs if task is None or s.task == task]


def suggest(name: str, limit: int = 5) -> list[str]:
    """The known names closest to ``name`` (spelling first, then names that contain it)."""
    names = list(_catalogue()) + list(ALIASES)
    close = difflib.get_close_matches(name.lower(), names, n=limit, cutoff=0.5)
    containing = [n for n in names if name.lower() in n.lower() and n not in close] if len(name) >= 3 else []
    return (close + containing)[:limit]


def get_spec(name: str) -> NetworkSpec:
    """The :class:`NetworkSpec` of ``name`` (aliases of the original benchmark accepted)."""
    catalogue = _catalogue()
    spec = catalogue.get(ALIASES.get(name, name))
    if spec is None:
        raise UnknownNetworkError(name, suggest(name))
    return spec


def build(spec: NetworkSpec, seed: int = 0) -> nn.Module:
    """Build ``spec``'s network on the CPU in fp32 with random weights drawn from ``seed``."""
    kwargs: dict[str, Any] = {"weights": None}
    if spec.task != "classification":
        kwargs["weights_backbone"] = None  # the default would download ImageNet backbone weights
    if spec.name in ("googlenet", "inception_v3"):
        kwargs["init_weights"] = True  # torchvision's own initialisation, without its FutureWarning
    torch.manual_seed(seed)
    model = models.get_model(spec.name, **kwargs)
    _initialise_zero_heads(model)
    return model


def _initialise_zero_heads(model: nn.Module) -> None:
    """Give a non-zero weight to linear layers that torchvision initialises to zero (the ViT head).

    Otherwise every output is exactly zero whatever the input, and comparing precisions on them would
    prove nothing. The amount of work is unchanged.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear) and not module.weight.detach().any():
            nn.init.normal_(module.weight, std=0.01)


def random_in_training(model: nn.Module) -> bool:
    """True when the training-mode forward pass draws random numbers (dropout, stochastic depth), so
    that two runs of it give different losses."""
    from torchvision.ops import StochasticDepth

    return any(isinstance(m, (nn.modules.dropout._DropoutNd, StochasticDepth)) and m.p > 0 for m in model.modules())


def make_inputs(spec: NetworkSpec, batch_size: int, input_size: int, generator: torch.Generator) -> Inputs:
    """A random fp32 batch on the CPU: one tensor, or a list of images for detectors."""
    if spec.task == "detection":
        return [torch.randn(3, input_size, input_size, generator=generator) for _ in range(batch_size)]
    return torch.randn(batch_size, 3, input_size, input_size, generator=generator)


def make_targets(spec: NetworkSpec, batch_size: int, input_size: int, generator: torch.Generator) -> Any:
    """Random training targets on the CPU: class indices, per-pixel classes, or boxes and labels."""
    if spec.task == "classification":
        return torch.randint(0, spec.num_classes, (batch_size,), generator=generator)
    if spec.task == "segmentation":
        return torch.randint(0, spec.num_classes, (batch_size, input_size, input_size), generator=generator)
    targets = []
    for _ in range(batch_size):
        n = _OBJECTS_PER_IMAGE
        corner = torch.rand(n, 2, generator=generator) * input_size / 2
        extent = (torch.rand(n, 2, generator=generator) * 0.375 + 0.125) * input_size
        target: dict[str, torch.Tensor] = {
            "boxes": torch.cat([corner, corner + extent], dim=1),
            "labels": torch.randint(1, spec.num_classes, (n,), generator=generator),
        }
        if spec.name.startswith("maskrcnn"):
            target["masks"] = torch.randint(0, 2, (n, input_size, input_size), generator=generator, dtype=torch.uint8)
        if spec.name.startswith("keypointrcnn"):
            points = torch.rand(n, 17, 2, generator=generator) * input_size
            target["keypoints"] = torch.cat([points, torch.ones(n, 17, 1)], dim=2)
        targets.append(target)
    return targets


def to_device(value: Any, device: torch.device, dtype: torch.dtype | None = None,
              channels_last: bool = False) -> Any:
    """Move tensors (also inside lists and dicts) to ``device``; cast floating ones to ``dtype`` and
    lay 4-d ones out channels-last when asked."""
    if isinstance(value, torch.Tensor):
        cast = dtype if dtype is not None and value.is_floating_point() else None
        value = value.to(device=device, dtype=cast)
        if channels_last and value.dim() == 4:
            value = value.contiguous(memory_format=torch.channels_last)
        return value
    if isinstance(value, list):
        return [to_device(v, device, dtype, channels_last) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device, dtype, channels_last) for k, v in value.items()}
    return value


def head(inputs: Inputs, count: int) -> Inputs:
    """The first ``count`` samples of a batch."""
    return inputs[:count]


def forward(model: nn.Module, spec: NetworkSpec, inputs: Inputs, targets: Any = None) -> Any:
    """Run the network; detectors take their targets in training mode and return their losses."""
    if spec.task == "detection" and model.training:
        return model(inputs, targets)
    return model(inputs)


def loss(spec: NetworkSpec, output: Any, targets: Any) -> torch.Tensor:
    """The training loss: cross-entropy over every head (main and auxiliary), or a detector's summed
    losses. Computed in fp32 whatever the network's precision."""
    if spec.task == "detection":
        return sum(v.float() for v in output.values())  # type: ignore[return-value]
    if spec.task == "segmentation":
        heads = [output[key] for key in ("out", "aux") if key in output]
    elif isinstance(output, tuple):  # Inception / GoogLeNet in training mode: main and auxiliary logits
        heads = [h for h in output if h is not None]
    else:
        heads = [output]
    return sum(F.cross_entropy(h.float(), targets) for h in heads)  # type: ignore[return-value]


def primary_output(spec: NetworkSpec, output: Any) -> torch.Tensor | None:
    """The tensor that precisions are compared on: logits, or the segmentation map. ``None`` for
    detectors, whose number of boxes depends on the values themselves."""
    if spec.task == "detection":
        return None
    if spec.task == "segmentation":
        return output["out"]
    return output[0] if isinstance(output, tuple) else output
