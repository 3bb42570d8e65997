"""Shared GPUs: the hub's device is named, a busy GPU is reported, finish() frees memory."""

import torch

from tinyllama.course import gpu_share


def test_busy_gpu_is_reported(monkeypatch, capsys):
    monkeypatch.setattr(gpu_share.dev, "memory_in_use_by_others", lambda device=None: 3 * 2**30)
    assert gpu_share.check_busy() is True
    assert "already busy: 3.0 GiB" in capsys.readouterr().out


def test_idle_gpu_and_cpu_are_not_reported(monkeypatch, capsys):
    monkeypatch.setattr(gpu_share.dev, "memory_in_use_by_others", lambda device=None: 200 * 2**20)
    assert gpu_share.check_busy() is False
    monkeypatch.setattr(gpu_share.dev, "memory_in_use_by_others", lambda device=None: None)
    assert gpu_share.check_busy() is False
    assert capsys.readouterr().out == ""


def test_finish_deletes_tensors_models_optimizers_and_frees_memory(monkeypatch, capsys):
    freed = []
    monkeypatch.setattr(gpu_share.dev, "free_memory", lambda device=None: freed.append(device))
    model = torch.nn.Linear(2, 2)
    namespace = {"x": torch.ones(3), "model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
                 "n": 5, "_hidden": torch.ones(1), "name": "keep me"}
    deleted = gpu_share.finish(namespace)
    assert deleted == ["model", "opt", "x"]
    assert set(namespace) == {"n", "_hidden", "name"}
    assert freed == [torch.device("cpu")]
    assert "deleted 3 tensor/model variable(s) (model, opt, x)" in capsys.readouterr().out


def test_finish_without_namespace_only_frees(monkeypatch):
    freed = []
    monkeypatch.setattr(gpu_share.dev, "free_memory", lambda device=None: freed.append(device))
    assert gpu_share.finish(quiet=True) == [] and len(freed) == 1


def test_cpu_device_is_described():
    assert gpu_share.describe_device("cpu").startswith("Device: cpu (CPU")


def test_gpu_assigned_by_the_hub_is_named(monkeypatch):
    monkeypatch.setattr(gpu_share.dev, "get_device", lambda name=None: torch.device("cuda", 0))
    monkeypatch.setattr(gpu_share.dev, "device_name", lambda device=None: "AMD Instinct MI300X")
    monkeypatch.setattr(gpu_share.dev, "visible_devices_variable", lambda: "HIP_VISIBLE_DEVICES")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "5")
    line = gpu_share.describe_device()
    assert "cuda:0 = AMD Instinct MI300X" in line and "HIP_VISIBLE_DEVICES=5, as assigned by the hub" in line
    monkeypatch.delenv("HIP_VISIBLE_DEVICES")
    assert "HIP_VISIBLE_DEVICES is not set" in gpu_share.describe_device()
