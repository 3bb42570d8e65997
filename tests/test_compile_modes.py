"""inference.compile_modes: one-time costs, cold and warm compiles from the same state, max-autotune's
choice tables, the operators of a forward pass, serving scenarios, and the plot."""

import os
import sys
from types import SimpleNamespace

import matplotlib
import pandas as pd
import pytest

from inference import compile_modes as cm

matplotlib.use("Agg")

AUTOTUNE_TEXT = """\
/x/compile_fx.py:322: UserWarning: TensorFloat32 tensor cores available but not enabled.
Autotune Choices Stats:
{"num_choices": 13, "num_triton_choices": 12, "best_kernel": "convolution", "best_time": 0.041}
AUTOTUNE convolution(16x64x56x56, 64x64x3x3)
strides: [200704, 1, 3584, 64], [576, 1, 192, 64]
dtypes: torch.float32, torch.float32
  convolution 0.0410 ms 100.0%
  triton_convolution2d_3 0.0520 ms 78.8% ALLOW_TF32=True, BLOCK_K=16, BLOCK_M=64
  triton_convolution2d_1 0.0900 ms 45.6% ALLOW_TF32=True, BLOCK_K=32, BLOCK_M=128
SingleProcess AUTOTUNE benchmarking takes 0.5000 seconds and 1.2500 seconds precompiling for 7 choices
AUTOTUNE addmm(16x1000, 16x512, 512x1000)
strides: [0, 1], [512, 1], [1, 512]
dtypes: torch.float32, torch.float32, torch.float32
  triton_mm_12 0.0100 ms 100.0% ACC_TYPE='tl.float32', BLOCK_K=32
  bias_addmm 0.0150 ms 66.7%
SingleProcess AUTOTUNE benchmarking takes 0.2500 seconds and 0.7500 seconds precompiling for 12 choices
something else printed after
"""


def _result(warmup_ms, median, precision="fp32", spread_pct=1.0):
    return SimpleNamespace(warmup_ms=warmup_ms, timing=SimpleNamespace(median=median, spread_pct=spread_pct),
                           ms_per_batch=median, precision=precision)


def test_one_time_seconds_counts_every_warm_up_iteration_beyond_the_median():
    # compile in the first (1000 ms), graph recording in the second (30 ms), steady after: 10 ms
    assert cm.one_time_seconds(_result([1010.0, 40.0, 10.0, 9.0], 10.0)) == pytest.approx(1.030)
    assert cm.one_time_seconds(_result([9.0, 10.0], 10.0)) == 0.0


def test_autotune_choices_reads_each_table():
    table = cm.autotune_choices(AUTOTUNE_TEXT)
    assert list(table["operation"]) == ["convolution", "addmm"]
    conv, mm = table.iloc[0], table.iloc[1]
    assert (conv["winner"], conv["winner_kind"], conv["winner_ms"]) == ("convolution", "library", 0.041)
    assert conv["library_ms"] == 0.041 and conv["choices"] == 7
    assert (conv["benchmark_s"], conv["precompile_s"]) == (0.5, 1.25)
    assert (mm["winner"], mm["winner_kind"], mm["winner_ms"]) == ("triton_mm_12", "generated (Triton)", 0.01)
    assert mm["library_ms"] == 0.015 and mm["choices"] == 12
    assert conv["sizes"] == "16x64x56x56, 64x64x3x3"


def test_autotune_choices_of_text_without_tables_is_empty():
    assert cm.autotune_choices("nothing autotuned\n").empty
    assert list(cm.autotune_choices("").columns)[:4] == ["operation", "sizes", "choices", "winner"]


def test_choice_kind():
    assert cm.choice_kind("triton_convolution2d_4") == "generated (Triton)"
    assert cm.choice_kind("mm") == cm.choice_kind("bias_addmm") == cm.choice_kind("convolution") == "library"
    assert cm.choice_kind("decompose_k_mm_256_split") == "other"


def test_captured_autotune_keeps_the_tables_and_passes_the_rest_on(capsys):
    with cm.captured_autotune() as printed:
        sys.stderr.write(AUTOTUNE_TEXT)
    assert printed == [AUTOTUNE_TEXT]
    err = capsys.readouterr().err
    assert "UserWarning" in err and "something else printed after" in err
    assert "AUTOTUNE" not in err and "triton_mm_12" not in err and "strides" not in err
    assert "Choices Stats" not in err and "num_choices" not in err


def test_forward_operators_of_resnet18():
    table = cm.forward_operators("resnet18", 64).set_index("operator")
    assert table.loc["conv2d", "calls"] == 20 and table.loc["batch_norm", "calls"] == 20
    assert table.loc["conv2d", "kind"] == table.loc["linear", "kind"] == "library"
    assert table.loc["relu_", "kind"] == "element-wise / other"
    assert table.loc["flatten", "kind"] == "view"
    assert int(table.loc[table["kind"] == "library", "calls"].sum()) == 21  # 20 convolutions and the classifier


def test_run_mode_compiles_cold_then_warm_in_one_fresh_folder(monkeypatch):
    seen, cleared = [], []

    def fake_run(config):
        seen.append((config.compile, dict(config.compile_options), os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                     os.environ.get("TRITON_CACHE_DIR")))
        return _result([500.0 if len(seen) % 2 else 50.0, 5.0], 5.0)

    monkeypatch.setattr(cm, "run_benchmark", fake_run)
    monkeypatch.setattr(cm, "_clear_memory_caches", lambda: cleared.append(len(seen)))
    outside = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    first = cm.run_mode("resnet18", "reduce-overhead", order=1, batch_size=2)
    second = cm.run_mode("resnet18", "default", order=2, batch_size=2)
    (c1, o1, dir1, triton1), (_, _, dir1_warm, _), (_, o2, dir2, _), (_, _, dir2_warm, _) = seen
    assert c1 and o1 == {"mode": "reduce-overhead"} and o2 == {"mode": "default"}
    assert dir1 == dir1_warm and dir2 == dir2_warm  # warm finds the folders its cold compile filled
    assert dir1 != dir2 and outside not in (dir1, dir2)  # every mode starts from empty folders
    assert triton1.startswith(dir1) and not os.path.exists(dir1)  # Triton's inside, all deleted after
    assert cleared == [1, 3]  # the in-memory modules are forgotten before each warm run
    assert (first.cold_s, first.warm_s, first.order) == (pytest.approx(0.495), pytest.approx(0.045), 1)
    assert second.mode == "default" and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == outside


def test_run_mode_sets_inductor_settings_for_both_compiles_only(monkeypatch):
    import torch._inductor.config as inductor_config

    before = inductor_config.max_autotune_conv_backends
    seen = []

    def fake_run(config):
        seen.append(inductor_config.max_autotune_conv_backends)
        return _result([500.0, 5.0], 5.0)

    monkeypatch.setattr(cm, "run_benchmark", fake_run)
    monkeypatch.setattr(cm, "_clear_memory_caches", lambda: None)
    cm.run_mode("resnet18", "max-autotune", order=1, inductor=cm.WITHOUT_CONV_TEMPLATES, batch_size=2)
    assert seen == ["ATEN", "ATEN"] and before != "ATEN"  # cold and warm compile without the templates
    assert inductor_config.max_autotune_conv_backends == before  # restored afterwards


def test_run_mode_refuses_compile_settings():
    with pytest.raises(ValueError, match="mode as an argument"):
        cm.run_mode("resnet18", "default", 1, compile_options={"mode": "max-autotune"})


def _table():
    eager = cm.ModeRun("eager", 0, _result([1000.0, 10.0], 10.0))
    default = cm.ModeRun("default", 1, _result([20005.0, 5.0], 5.0), _result([2005.0, 5.0], 5.0))
    return cm.modes_table([eager, default])


def test_modes_table():
    table = _table()
    assert list(table.index) == ["eager", "default"]
    assert table.loc["eager", "compile_cold_s"] == table.loc["eager", "compile_warm_s"] == pytest.approx(0.99)
    assert table.loc["default", "compile_cold_s"] == pytest.approx(20.0)
    assert table.loc["default", "compile_warm_s"] == pytest.approx(2.0)
    assert table.loc["default", "speedup"] == pytest.approx(2.0) and table.loc["default", "order"] == 1


def test_serving_seconds_by_hand():
    kept = cm.Scenario("kept", "", starts=3, batches_per_start=1000, kept_cache=True)
    fresh = cm.Scenario("fresh", "", starts=3, batches_per_start=1000, kept_cache=False)
    # 20 s cold once, 2 s warm twice, 3000 batches of 5 ms
    assert cm.serving_seconds(20.0, 2.0, 5.0, kept) == pytest.approx(20 + 4 + 15)
    assert cm.serving_seconds(20.0, 2.0, 5.0, fresh) == pytest.approx(60 + 15)
    costs = cm.scenario_costs(_table(), [kept, fresh])
    assert costs.loc["eager", "kept"] == pytest.approx(3 * 0.99 + 30)
    assert costs.loc["default", "fresh"] == pytest.approx(75)


def test_plot_modes_has_titles_labels_and_a_log_axis():
    fig = cm.plot_modes(_table(), "modes on resnet18")
    left, right = fig.axes
    assert fig._suptitle.get_text() == "modes on resnet18"
    assert "ms" in left.get_ylabel() and "s, log" in right.get_ylabel()
    assert right.get_yscale() == "log" and left.get_title() and right.get_title()
    assert "1st" in right.get_xticklabels()[0].get_text()


def test_ordinal():
    assert [cm.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd"]
