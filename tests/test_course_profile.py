"""Size profiles: chosen from WORKSHOP_PROFILE or from the presence of a GPU, sizes in one place."""

import pytest

from tinyllama import config
from tinyllama.course import profile as prof
from tinyllama.course import session


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(prof.dev, "backend", lambda: "cpu")


@pytest.fixture
def with_gpu(monkeypatch):
    monkeypatch.setattr(prof.dev, "backend", lambda: "cuda")


def test_without_gpu_and_variable_ci_is_chosen_and_said(monkeypatch, no_gpu):
    monkeypatch.delenv("WORKSHOP_PROFILE", raising=False)
    selection = prof.select_profile()
    assert selection.profile.name == "ci"
    assert "no GPU" in selection.message() and "WORKSHOP_PROFILE=gpu" in selection.message()


def test_with_gpu_and_no_variable_gpu_is_chosen(monkeypatch, with_gpu):
    monkeypatch.delenv("WORKSHOP_PROFILE", raising=False)
    assert prof.get_profile().name == "gpu"


def test_variable_wins_over_detection(monkeypatch, with_gpu):
    monkeypatch.setenv("WORKSHOP_PROFILE", "CI")
    selection = prof.select_profile()
    assert selection.profile.name == "ci" and "WORKSHOP_PROFILE" in selection.reason


def test_explicit_argument_wins_over_variable(monkeypatch, with_gpu):
    monkeypatch.setenv("WORKSHOP_PROFILE", "ci")
    assert prof.get_profile("gpu").name == "gpu"


def test_gpu_profile_without_gpu_is_a_clear_error(monkeypatch, no_gpu):
    monkeypatch.setenv("WORKSHOP_PROFILE", "gpu")
    with pytest.raises(RuntimeError, match="no GPU.*WORKSHOP_PROFILE=ci"):
        prof.select_profile()


def test_unknown_profile_names_the_choices(monkeypatch, no_gpu):
    monkeypatch.setenv("WORKSHOP_PROFILE", "huge")
    with pytest.raises(ValueError, match="unknown workshop profile 'huge'.*gpu, ci"):
        prof.select_profile()


def test_ci_sizes_are_smaller_than_gpu_sizes():
    gpu, ci = prof.PROFILES["gpu"], prof.PROFILES["ci"]
    for name in ("repeat", "matmul_size", "copy_bytes", "inference_batch_size", "image_size",
                 "inference_steps", "train_steps"):
        assert getattr(ci, name) < getattr(gpu, name), name
    assert max(ci.inference_batch_sizes) < max(gpu.inference_batch_sizes)
    assert max(ci.tinyllama_seq_lens) < max(gpu.tinyllama_seq_lens)
    assert config.get_preset(ci.tinyllama_preset).model.num_parameters() < \
        config.get_preset(gpu.tinyllama_preset).model.num_parameters()


@pytest.mark.parametrize("name", list(prof.PROFILES))
def test_profile_sizes_are_consistent(name):
    p = prof.PROFILES[name]
    assert p.name == name
    config.get_preset(p.tinyllama_preset)  # raises for an unknown preset
    # Notebook 00 sweeps up to the ceiling's size and starts its slider there.
    assert list(p.matmul_sweep) == sorted(p.matmul_sweep) and p.matmul_sweep[-1] == p.matmul_size
    assert set(p.matmul_precisions) <= set(config.PRECISIONS)
    assert p.inference_batch_size in p.inference_batch_sizes
    assert p.as_dict()["name"] == name


def test_start_announces_profile_device_and_results_dir(monkeypatch, tmp_path, capsys, no_gpu):
    monkeypatch.delenv("WORKSHOP_PROFILE", raising=False)
    monkeypatch.setenv("WORKSHOP_RESULTS_DIR", str(tmp_path))
    s = session.start("00_environment_check")
    out = capsys.readouterr().out
    assert s.profile.name == "ci" and s.device.type == "cpu"
    assert "Profile: ci" in out and "Device: cpu" in out and str(tmp_path) in out
