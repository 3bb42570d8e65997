"""Moving weights between versions.

V1's parameter names are canonical. A faster version may fuse several V1 projections into one
(V2's ``qkv_proj`` is ``q_proj``, ``k_proj`` and ``v_proj`` stacked along the output dimension). Such
a version says so in its ``fused_weights()`` method (V1's returns none)::

    {"attn.qkv_proj.weight": [("attn.q_proj.weight", 1024), ("attn.k_proj.weight", 512), ...]}

mapping the suffix of a fused parameter name to its parts and their row counts. Everything else
must carry V1's names. With that, any version's weights map to any other's.
"""

from __future__ import annotations

import torch
from torch import nn

FusedSpec = dict[str, list[tuple[str, int]]]


def unwrap(model: nn.Module) -> nn.Module:
    """The eager module inside a ``torch.compile`` wrapper (whose names carry an "_orig_mod." prefix)."""
    return getattr(model, "_orig_mod", model)


def _split_fused(
    named: dict[str, torch.Tensor | None], spec: FusedSpec
) -> dict[str, torch.Tensor | None]:
    """``named`` tensors under V1's names: each fused tensor split by rows into its parts."""
    out: dict[str, torch.Tensor | None] = {}
    for name, tensor in named.items():
        suffix = next((s for s in spec if name.endswith(s)), None)
        if suffix is None:
            out[name] = tensor
            continue
        prefix = name[: -len(suffix)]
        rows = [n for _, n in spec[suffix]]
        if tensor is not None and sum(rows) != tensor.shape[0]:
            raise ValueError(f"{name}: fused rows {tensor.shape[0]} do not add up to its parts {rows}")
        pieces = torch.split(tensor, rows, dim=0) if tensor is not None else [None] * len(rows)
        for (part, _), piece in zip(spec[suffix], pieces):
            out[prefix + part] = piece
    return out


def canonical_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s parameters under V1's names, with fused weights split into their parts."""
    model = unwrap(model)
    return _split_fused(dict(model.state_dict()), model.fused_weights())  # type: ignore[return-value]


def canonical_gradients(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Each parameter's gradient under V1's name (``None`` where it has none), fused gradients split
    into their parts, so that gradients of any two versions can be compared name by name."""
    model = unwrap(model)
    return _split_fused({n: p.grad for n, p in model.named_parameters()}, model.fused_weights())


def from_canonical(model: nn.Module, canonical: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict for ``model`` built from canonical (V1-named) tensors."""
    model = unwrap(model)
    spec = model.fused_weights()
    out: dict[str, torch.Tensor] = {}
    for name in model.state_dict():
        suffix = next((s for s in spec if name.endswith(s)), None)
        if suffix is None:
            out[name] = canonical[name]
        else:
            prefix = name[: -len(suffix)]
            out[name] = torch.cat([canonical[prefix + part] for part, _ in spec[suffix]], dim=0)
    return out


def transfer_weights(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Copy ``src``'s weights into ``dst`` (any two versions of the same shape); returns ``dst``.

    Raises ``ValueError`` naming the first mismatch when the two models do not have the same shape.
    """
    canonical = canonical_state_dict(src)
    try:
        state = from_canonical(dst, canonical)
    except KeyError as missing:
        raise ValueError(f"cannot transfer weights: the source has no parameter {missing}") from None
    target = unwrap(dst).state_dict()
    for name, tensor in state.items():
        if tensor.shape != target[name].shape:
            raise ValueError(
                f"cannot transfer weights: {name} has shape {tuple(tensor.shape)} in the source and "
                f"{tuple(target[name].shape)} in the destination (are the configs the same?)"
            )
    unwrap(dst).load_state_dict(state)
    return dst
