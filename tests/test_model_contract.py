"""The model contract that the harnesses read: declared on V1's class, and each version's switches
the real keyword switches of its constructor."""

import inspect

import pytest

from tinyllama.config import get_preset
from tinyllama.models import VERSIONS, build, model_class
from tinyllama.models.v1_baseline import TinyLlama


@pytest.mark.parametrize("version", VERSIONS)
def test_each_version_declares_its_switches(version):
    cls = model_class(version)
    assert issubclass(cls, TinyLlama)
    keyword = [name for name, p in inspect.signature(cls.__init__).parameters.items() if p.kind == p.KEYWORD_ONLY]
    assert list(cls.switch_names) == keyword


def test_the_defaults_are_v1s_and_versions_override_them():
    config = get_preset("ci").model
    v1, v4 = build("v1", config), build("v4", config, compile=False)
    assert (v1.preferred_precision, v1.fused_optimizer, v1.compiled, v1.own_cuda_graphs) == ("fp32", False, False, False)
    assert v1.fused_weights() == {} and v1.switch_names == ()
    assert (v4.preferred_precision, v4.fused_optimizer, v4.compiled) == ("bf16", True, False)
    assert build("v4", config, compile_mode="reduce-overhead").own_cuda_graphs
    assert set(build("v2", config).fused_weights()) == {"attn.qkv_proj.weight", "mlp.gate_up_proj.weight"}
