"""Later notebooks read notebook 00's ceilings with their p10-p90 bands, and derive a ridge point's band."""

import pytest
import torch

from tinyllama.costs.ceilings import Ceiling
from tinyllama.course import get_profile, results
from tinyllama.course.device_ceilings import NOTEBOOK_00, device_ceilings
from tinyllama.timing import summarize


def _record_00(directory, profile, spreads):
    figures = {f"matmul_{p}_tflops": 2.0 for p in profile.matmul_precisions}
    figures.update({"matmul_size": profile.matmul_size, "copy_tbs": 0.5, "verdict": "ok"})
    results.record(NOTEBOOK_00, figures, profile=profile.name, directory=directory, quiet=True, spreads=spreads)


def test_a_rates_band_is_its_work_over_the_p90_and_the_p10_time():
    ceiling = Ceiling("matmul", "fp32", 10.0, "TFLOP/s", 8, summarize([0.9, 1.0, 1.0, 1.0, 1.1] * 4))
    low, high = ceiling.spread
    assert low == pytest.approx(10.0 / ceiling.time.p90) and high == pytest.approx(10.0 / ceiling.time.p10)
    assert low < ceiling.value < high


def test_the_recorded_bands_come_back_and_give_the_ridge_points_band(tmp_path):
    profile = get_profile("ci")
    precision = profile.matmul_precisions[0]
    _record_00(tmp_path, profile, {f"matmul_{precision}_tflops": (1.8, 2.1), "copy_tbs": (0.45, 0.6)})
    found = device_ceilings(torch.device("cpu"), profile, (precision,), directory=tmp_path, quiet=True)
    assert found.recorded and found.spreads == {precision: (1.8, 2.1), "copy": (0.45, 0.6)}
    # The lowest compute over the highest bandwidth, the highest over the lowest: around the ridge 2 / 0.5 = 4.
    assert found.ridge_spread(precision) == pytest.approx((1.8 / 0.6, 2.1 / 0.45))
    assert found.ridge_spread(precision)[0] < found.roofs.ridge(precision) < found.ridge_spread(precision)[1]


def test_a_record_without_bands_gives_no_ridge_band_and_a_measurement_gives_one(tmp_path):
    profile = get_profile("ci")
    precision = profile.matmul_precisions[0]
    _record_00(tmp_path, profile, None)
    assert device_ceilings("cpu", profile, (precision,), directory=tmp_path, quiet=True).ridge_spread(precision) is None
    measured = device_ceilings("cpu", profile, (precision,), directory=tmp_path / "empty", quiet=True)
    assert not measured.recorded
    low, high = measured.ridge_spread(precision)
    assert low <= measured.roofs.ridge(precision) <= high
