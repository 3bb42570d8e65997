"""tinyllama.profiling.sdpa_reasons: each SDPA backend's own reason, from PyTorch's per-backend checks.

The warning texts below are PyTorch's own (aten/src/ATen/native/transformers/sdp_utils_cpp.h and
cuda/sdp_utils.cpp), in the two forms they reach a process: a C++ log line on standard error (what
``torch.backends.cuda.can_use_*_attention(params, debug=True)`` writes; the first line was captured from
torch 2.14 on this machine) and a Python warning with PyTorch's "(Triggered internally at ...)" suffix
(what an SDPA call that fails gives: the stored H200 run of notebook 16 printed the header line)."""

import os
import warnings

import pytest
import torch

from tinyllama.profiling import sdpa_reasons
from tinyllama.profiling.sdpa_reasons import (BackendVerdict, backend_verdicts, capture_native_warnings,
                                              clean_message, parse_debug_output, sdpa_params, verdicts_from_checks)

ON_DEVICE = ("All tensors need to be on cuda device. Got query on device: cpu, key on device: cpu, value on "
             "device: cpu")
LOGGED = f"[W1127 03:57:51.333166426 sdp_utils.cpp:588] Warning: {ON_DEVICE} (function check_all_tensors_on_device)"
DTYPE = ("Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float, Key dtype: "
         "float, and Value dtype: float instead.")
HEADS = ("For dense input, both fused kernels require query, key and value to have the same num_heads. "
         "Query.sizes(): [16, 8, 512, 128], Key sizes(): [16, 4, 512, 128], Value sizes(): [16, 4, 512, 128] "
         "instead. To broadcast dense inputs, try using unsqueeze and expand_to before passing them into the kernel.")
SPLIT = DTYPE.index(" Got")
TRIGGERED = " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:986.)"


def _qkv(heads=8, kv_heads=4, seq=16, head_dim=64):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, h, seq, head_dim, generator=g) for h in (heads, kv_heads, kv_heads))


@pytest.mark.parametrize("text", [
    LOGGED,
    f"[W sdp_utils.cpp:588] Warning: {ON_DEVICE} (function check_all_tensors_on_device)",  # older torch
    f"W1127 03:57:51.333166 4242 sdp_utils.cpp:588] Warning: {ON_DEVICE} (function check_all_tensors_on_device)",
    ON_DEVICE + TRIGGERED,  # a Python warning
    ON_DEVICE + TRIGGERED.replace(" (", "\n("),  # with the suffix on a line of its own
])
def test_clean_message_keeps_the_reason_alone(text):
    assert clean_message(text) == ON_DEVICE


def test_the_dispatchers_headers_are_not_reasons():
    # What a forced, refused backend printed in the stored run: a header with an empty reason.
    assert parse_debug_output("Memory efficient kernel not used because:" + TRIGGERED) == []
    stream = "\n".join([
        "[W1127 03:57:51.1 sdp_utils.cpp:900] Warning: Memory efficient kernel not used because: (function x)",
        f"[W1127 03:57:51.2 sdp_utils.cpp:540] Warning: {HEADS} (function check_batch_size_and_num_heads_dense)",
        f"[W1127 03:57:51.3 sdp_utils_cpp.h:99] Warning: {DTYPE[:SPLIT]}",  # a message broken over two lines
        f"{DTYPE[SPLIT + 1:]} (function check_tensor_dtype)",
        f"[W1127 03:57:51.4 sdp_utils_cpp.h:99] Warning: {HEADS} (function check_batch_size_and_num_heads_dense)",
    ])
    assert parse_debug_output(stream) == [HEADS, DTYPE]  # each reason once, in order


def test_capture_reads_standard_error_and_python_warnings_then_restores_them(capfd):
    def noisy():
        os.write(2, (LOGGED + "\n").encode())
        warnings.warn(DTYPE + TRIGGERED)
        return 42

    result, reasons = capture_native_warnings(noisy)
    os.write(2, b"after the capture\n")
    assert result == 42
    assert reasons == [DTYPE, ON_DEVICE]
    err = capfd.readouterr().err
    assert "after the capture" in err and ON_DEVICE not in err


def _writes(message, result=False, python=False):
    """A stand-in for one of PyTorch's checks: it says ``message`` as PyTorch would and returns ``result``."""
    def check(params, debug):
        assert debug is True
        if message and python:
            warnings.warn(message + TRIGGERED)
        elif message:
            os.write(2, f"[W1127 03:57:51.5 sdp_utils.cpp:1] Warning: {message} (function check)\n".encode())
        return result
    return check


def test_each_reason_stays_with_its_backend():
    q, k, v = _qkv()
    checks = {"cudnn": _writes("cuDNN's own reason", python=True), "flash": _writes("flash's own reason"),
              "efficient": _writes(HEADS)}
    verdicts = {x.backend: x for x in verdicts_from_checks(sdpa_params(q, k, v), checks)}
    assert [x for x in verdicts] == ["cudnn", "flash", "efficient", "math"]
    assert verdicts["cudnn"].reasons == ("cuDNN's own reason",)
    assert verdicts["flash"].reasons == ("flash's own reason",)
    assert verdicts["efficient"].reasons == (HEADS,)
    assert verdicts["math"].usable is True
    for name in ("cudnn", "flash", "efficient"):
        assert verdicts[name].usable is False
        assert "Triggered internally" not in verdicts[name].describe()
        assert verdicts[name].describe().startswith(f"{sdpa_reasons.LABELS[name]}: refused: ")


def test_a_usable_backend_has_no_reason_and_a_silent_refusal_says_so():
    q, k, v = _qkv()
    verdicts = verdicts_from_checks(sdpa_params(q, k, v), {"cudnn": _writes("", result=True),
                                                           "flash": _writes(""), "efficient": None})
    assert verdicts[0] == BackendVerdict("cudnn", True, ())
    assert verdicts[0].describe() == "cuDNN: can run these inputs"
    assert verdicts[1].describe() == "flash: refused: PyTorch gave no reason"
    assert verdicts[2].usable is None
    assert "has no torch.backends.cuda.can_use_efficient_attention" in verdicts[2].describe()


def test_a_check_that_raises_is_reported_not_raised():
    def broken(params, debug):
        raise RuntimeError("CUDA error: CUDA driver version is insufficient\nmore detail")
    q, k, v = _qkv()
    verdict = verdicts_from_checks(sdpa_params(q, k, v), {"cudnn": broken, "flash": None, "efficient": None})[0]
    assert verdict.usable is None
    assert verdict.reasons == ("PyTorch's check failed: CUDA error: CUDA driver version is insufficient",)


def test_pytorchs_own_checks_on_cpu_tensors():
    # A CUDA build of torch refuses CPU tensors with a logged reason; a CPU-only build refuses silently.
    q, k, v = _qkv()
    checks = {"flash": torch.backends.cuda.can_use_flash_attention,
              "efficient": torch.backends.cuda.can_use_efficient_attention, "cudnn": None}
    verdicts = verdicts_from_checks(sdpa_params(q, k, v), checks)
    for verdict in verdicts[1:3]:
        assert verdict.usable is False
        if torch.version.cuda is not None:
            assert verdict.reasons == (ON_DEVICE,)
        else:
            assert verdict.reasons == ()


def test_grouped_heads_are_passed_as_such():
    q, k, v = _qkv()
    params = sdpa_params(q, k, v, causal=False)
    assert params.enable_gqa is True and params.is_causal is False
    assert sdpa_params(q, q, q).enable_gqa is False


def test_on_a_cpu_the_gpu_backends_are_named_and_nothing_is_asked(monkeypatch):
    def never(params, debug):
        raise AssertionError("a GPU check was called for CPU tensors")
    for check in sdpa_reasons.CHECKS.values():
        monkeypatch.setattr(torch.backends.cuda, check, never, raising=False)
    verdicts = backend_verdicts(*_qkv())
    assert [x.usable for x in verdicts] == [None, None, None, True]
    assert all("GPU backend" in x.describe() for x in verdicts[:3])
    assert "GPU backends" in sdpa_reasons.CPU_NOTE


def test_a_disabled_math_path_is_refused():
    torch.backends.cuda.enable_math_sdp(False)
    try:
        verdict = backend_verdicts(*_qkv())[3]
    finally:
        torch.backends.cuda.enable_math_sdp(True)
    assert verdict.usable is False and "disabled" in verdict.describe()


@pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None
                    or torch.cuda.get_device_capability() < (8, 0), reason="an NVIDIA GPU of sm80 or newer")
def test_on_an_nvidia_gpu_fp32_is_refused_by_cudnn_and_flash_for_its_dtype():
    # V4's attention shape in fp32: cuDNN and flash take only fp16/bf16, each says so in its own words.
    q, k, v = (t.to("cuda").requires_grad_() for t in _qkv(heads=8, kv_heads=4, seq=512, head_dim=128))
    verdicts = {x.backend: x for x in backend_verdicts(q, k, v)}
    for name in ("cudnn", "flash"):
        assert verdicts[name].usable is False
        assert any("dtype" in reason for reason in verdicts[name].reasons), verdicts[name].describe()
    for verdict in verdicts.values():
        assert not any("not used because" in r or "Triggered internally" in r for r in verdict.reasons)
    assert verdicts["math"].usable is True
    bf16 = {x.backend: x for x in backend_verdicts(*(t.detach().bfloat16().requires_grad_() for t in (q, k, v)))}
    assert bf16["flash"].usable is True, bf16["flash"].describe()
