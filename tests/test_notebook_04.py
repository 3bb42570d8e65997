"""Notebook 04 (counting FLOPs): its exercise checks pass the reference answers and catch plausible wrong
ones, and the library pieces it stands on state facts that would be false if they were wrong (a convolution's
FLOPs against PyTorch's counter, batch norm's FLOPs, TF32 for convolutions, the roofline split by shapes)."""

import matplotlib

matplotlib.use("Agg")

import re  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from inference import networks  # noqa: E402
from notebook_exercises import SolutionExercises, run_source  # noqa: E402
from tinyllama import course  # noqa: E402
from tinyllama import device as dev  # noqa: E402
from tinyllama.course import flops_checks  # noqa: E402
from tinyllama.course.checkpoints import CheckpointFailed  # noqa: E402
from tinyllama.profiling import attribution, roofline  # noqa: E402
from tinyllama.profiling.torch_profiler import ELEMENTWISE, GEMM, REDUCTION, profile_steps  # noqa: E402

pytestmark = pytest.mark.usefixtures("strict")

NETWORK, BATCH, SIZE = "resnet18", 2, 64
ROOFS = roofline.Roofs("test GPU", {"fp32": 60.0, "tf32": 400.0}, 4.0)


@pytest.fixture(scope="module")
def notebook():
    return SolutionExercises("04_flops_profiler")


@pytest.fixture(scope="module")
def built():
    """The notebook's model and its convolutions' inputs, at the ci sizes."""
    spec = networks.get_spec(NETWORK)
    model = networks.build(spec, seed=0).eval()
    return model, flops_checks.conv_inputs(model, (BATCH, 3, SIZE, SIZE))


def _namespace(**extra):
    namespace = {"torch": torch, "pd": pd, "plt": plt, "course": course, "networks": networks, "dev": dev,
                 "flops_checks": flops_checks, "display": lambda *a, **k: None, "network": NETWORK, "batch": BATCH,
                 "size": SIZE, "device": torch.device("cpu"), "conv_format": "fp32", "roofline": roofline,
                 "ELEMENTWISE": ELEMENTWISE, "GEMM": GEMM, "REDUCTION": REDUCTION}
    namespace.update(extra)
    return namespace


def test_the_exercises_and_their_order(notebook):
    assert notebook.ids() == ["04.1", "04.2", "04.3", "04.4"]


def test_the_conv_formula_passes_on_every_layer(notebook):
    namespace = notebook.run("04.1", _namespace())
    assert len(namespace["convs"]) == 20 and namespace["conv_flops_ok"]


@pytest.mark.parametrize("mistake, message", [
    (("return 2 * n * conv.out_channels", "return n * conv.out_channels"), "a multiply-add (MAC) is two FLOPs"),
    (("return 2 * n * conv.out_channels", "return 2 * conv.out_channels"), "every image of the batch is convolved"),
    # groups ignored: only the odd convolutions catch it
    (("(c_in // conv.groups)", "c_in"), "each output channel sees only in_channels / g"),
    (("h_out = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1", "h_out = h"), "counted over the input's pixels"),
    ((") // sh + 1", ") + 1"), "the stride is missing from the output size"),  # in the height only
    # the stride left out of both sizes
    ((") // sh + 1", ") + 1", ") // sw + 1", ") + 1"), "the stride is missing from the output size"),
    (("2 * ph", "0 * ph", "2 * pw", "0 * pw"), "the padding is missing from the output size"),
    (("dh * (kh - 1)", "(kh - 1)", "dw * (kw - 1)", "(kw - 1)"), "the dilation is missing"),
    # the dilation ignored along the width only (the odd convolution is dilated along its width)
    (("dw * (kw - 1)", "(kw - 1)"), "the dilation is missing"),
    (("// sh + 1", "/ sh + 1", "// sw + 1", "/ sw + 1"), "divide by the stride with //, not /"),
])
def test_conv_formula_mistakes_fail(notebook, mistake, message):
    source = notebook.source("04.1")
    for old, new in zip(mistake[::2], mistake[1::2]):
        assert old in source
        source = source.replace(old, new)
    namespace = _namespace()
    with pytest.raises(CheckpointFailed, match=re.escape(message)):
        run_source(source, namespace)
        run_source(notebook.check_source("04.1"), namespace)


def test_the_formula_with_every_part_is_the_reference(built):
    cases = dict(built[1]) | {name: (make(), shape) for name, make, shape in flops_checks.ODD_CONVS}
    for conv, shape in cases.values():
        assert flops_checks.conv_formula(conv, shape) == flops_checks.counted_flops(conv, shape)
    # each slip differs from the reference somewhere in these cases: the check can tell it apart
    for switches, _ in flops_checks.CONV_SLIPS:
        assert any(flops_checks.conv_formula(conv, shape, **switches) != flops_checks.counted_flops(conv, shape)
                   for conv, shape in cases.values()), switches


def test_a_forgotten_batch_is_named(built, capsys, lenient):
    def per_image(conv, shape):
        n, c_in, h, w = shape
        return flops_checks.counted_flops(conv, (1, c_in, h, w))

    assert not flops_checks.check_conv_flops(per_image, built[1])
    assert "every image of the batch is convolved" in capsys.readouterr().out


def _rate_namespace(datasheet):
    return _namespace(forward_flops=6e11, median_ms=12.0, ceiling_tflops=400.0, datasheet_tflops=datasheet,
                      predicted_mfu=None)


@pytest.mark.parametrize("datasheet", [494.7, None])
def test_the_rate_and_mfu_pass(notebook, datasheet):
    namespace = notebook.run("04.2", _rate_namespace(datasheet))
    assert namespace["achieved_tflops"] == pytest.approx(50.0) and namespace["mfu_ok"]
    plt.close("all")


@pytest.mark.parametrize("mistake", [
    ("forward_flops / (median_ms / 1e3) / 1e12", "forward_flops / median_ms / 1e12"),  # milliseconds as seconds
    ("forward_flops / (median_ms / 1e3) / 1e12", "forward_flops / 2 / (median_ms / 1e3) / 1e12"),  # MACs
    ("mfu_measured = achieved_tflops / ceiling_tflops", "mfu_measured = 100 * achieved_tflops / ceiling_tflops"),
    ("mfu_datasheet = achieved_tflops / datasheet_tflops", "mfu_datasheet = achieved_tflops / ceiling_tflops"),
])
def test_rate_and_mfu_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("04.2", _rate_namespace(494.7), mistake)
    plt.close("all")


def _intensity_namespace(built, notebook):
    model, convs = built
    conv, conv_input_shape = convs["layer1.0.conv2"]
    stem, stem_shape = convs["conv1"]
    with torch.no_grad():
        bn_shape = tuple(stem(torch.empty(stem_shape, device="meta")).shape)
    namespace = notebook.run("04.1", _namespace(), check=False)
    namespace.update(model=model, conv=conv, conv_input_shape=conv_input_shape, bn_shape=bn_shape, itemsize=4,
                     ridges={"convolution": 50.0, "batch norm": ROOFS.ridge("fp32"), "ReLU": ROOFS.ridge("fp32")})
    return namespace


def test_the_intensities_pass(notebook, built):
    namespace = notebook.run("04.3", _intensity_namespace(built, notebook))
    # layer1.0.conv2 at batch 2 does 92 FLOP/byte: right of a ridge at 50; batch norm and ReLU far left of 15
    assert namespace["predicted_bound"] == {"convolution": "compute", "batch norm": "memory", "ReLU": "memory"}
    assert namespace["intensities_ok"] and namespace["bounds_ok"]
    assert namespace["intensities"]["ReLU"] == pytest.approx(0.125)


@pytest.mark.parametrize("mistake", [
    ("n * c * h * w + conv.weight.numel() + conv_out", "n * c * h * w + conv.weight.numel()"),  # output never written
    ('intensities["batch norm"] = 2 * elements', 'intensities["batch norm"] = elements'),  # one FLOP per element
    ("intensities[\"ReLU\"] = elements / (itemsize * 2 * elements)", "intensities[\"ReLU\"] = elements / (itemsize * elements)"),
    ('"compute" if value >= ridges[kind] else "memory"', '"memory" if value >= ridges[kind] else "compute"'),  # swapped
])
def test_intensity_mistakes_fail(notebook, built, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("04.3", _intensity_namespace(built, notebook), mistake)


def _points():
    """Many small memory-bound points that lose little, few large compute-bound ones: the row share, the
    time share, the worst percent of roof and the largest excess all differ."""
    rows = [{"operator": f"aten::relu_ {i}", "category": "element-wise", "flops": 1e6, "bytes": 8e6, "time_ms": 0.01,
             "precision": "fp32", "flop_source": "estimate"} for i in range(8)]
    rows += [{"operator": "aten::convolution big", "category": "GEMM (projections)", "flops": 4e12, "bytes": 4e10,
              "time_ms": 20.0, "precision": "tf32", "flop_source": "flop_counter"},
             {"operator": "aten::convolution small", "category": "GEMM (projections)", "flops": 1e11, "bytes": 1e9,
              "time_ms": 1.0, "precision": "tf32", "flop_source": "flop_counter"},
             {"operator": "aten::cudnn_batch_norm x", "category": "norm & reduction", "flops": 2e9, "bytes": 8e9,
              "time_ms": 2.5, "precision": "fp32", "flop_source": "estimate"}]
    return roofline.classify(pd.DataFrame(rows), ROOFS).assign(label=NETWORK)


def test_the_roof_reading_passes(notebook):
    namespace = notebook.run("04.4", _namespace(points=_points(), device_ms=23.58))
    assert namespace["most_excess"] == "aten::convolution big"
    assert namespace["memory_bound_pct"] == pytest.approx(100 * 2.58 / 23.58)


@pytest.mark.parametrize("mistake", [
    ('100 * points.loc[points["bound"] == "memory", "time_ms"].sum() / points["time_ms"].sum()',
     '100 * (points["bound"] == "memory").mean()'),  # rows, not time
    ('100 * points.loc[points["bound"] == "memory", "time_ms"].sum() / points["time_ms"].sum()',
     'points.loc[points["bound"] == "memory", "time_ms"].sum() / points["time_ms"].sum()'),  # a fraction
    ('points.loc[points["excess_ms"].idxmax(), "operator"]', 'points.loc[points["pct_of_roof"].idxmin(), "operator"]'),
    ('points.loc[points["excess_ms"].idxmax(), "operator"]', 'points.loc[points["time_ms"].idxmax(), "operator"]'
     ' if False else "aten::relu_ 0"'),
])
def test_roof_reading_mistakes_fail(notebook, mistake):
    with pytest.raises(CheckpointFailed):
        notebook.run("04.4", _namespace(points=_points(), device_ms=23.58), mistake)


# --------------------------------------------------------------------------------------------------
# The library the notebook stands on
# --------------------------------------------------------------------------------------------------


def test_the_whole_network_count_equals_the_sum_over_its_layers(built):
    model, convs = built
    total = flops_checks.counted_flops(model, (BATCH, 3, SIZE, SIZE))
    layers = sum(flops_checks.counted_flops(conv, shape) for conv, shape in convs.values())
    linear = 2 * BATCH * model.fc.in_features * model.fc.out_features
    assert total == layers + linear
    assert convs["conv1"][1] == (BATCH, 3, SIZE, SIZE) and convs["layer4.1.conv2"][1] == (BATCH, 512, 2, 2)


def test_batch_norm_and_relu_work_as_the_roofline_counts_it():
    flops, nbytes = flops_checks.layer_work(nn.BatchNorm2d(8), (3, 8, 5, 7))
    elements = 3 * 8 * 5 * 7
    # x read and y written; the four per-channel vectors read (and, by some kernels, two statistics written)
    assert flops == 2 * elements and 4 * (2 * elements + 4 * 8) <= nbytes <= 4 * (2 * elements + 6 * 8)
    assert flops_checks.layer_work(nn.ReLU(inplace=True), (3, 8, 5, 7)) == (elements, 4 * 2 * elements)


@pytest.fixture
def tf32_switches():
    """PyTorch's two public TF32 switches, restored after the test (``torch.backends.cuda.matmul`` serves
    ``allow_tf32`` through ``__getattr__``, which monkeypatch cannot undo)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_convolutions_follow_cudnns_tf32_switch_and_matmuls_their_own(monkeypatch, tf32_switches):
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setattr(torch.version, "hip", None)
    assert attribution.allows_tf32("aten::convolution") and not attribution.allows_tf32("aten::mm")
    torch.backends.cuda.matmul.allow_tf32 = True
    assert attribution.allows_tf32("aten::mm")
    torch.backends.cudnn.allow_tf32 = False
    assert not attribution.allows_tf32("aten::convolution")
    torch.backends.cudnn.allow_tf32 = True
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert not attribution.allows_tf32("aten::convolution")  # MIOpen keeps fp32 convolutions in fp32


class _TwoBlocks(nn.Module):
    """Two conv-BN-ReLU blocks of different shapes, the second called twice: three signatures per operator
    would be wrong, two right."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.b = nn.Sequential(nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.c = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))

    def forward(self, x):
        return self.c(self.b(self.a(x)))


def test_points_by_shape_split_an_operator_and_add_up_to_it():
    model = _TwoBlocks().eval()
    x = torch.randn(2, 3, 16, 16)

    def forward():
        with torch.no_grad():
            return model(x)

    work = attribution.count_operator_work(forward)
    run = profile_steps(forward, device="cpu", wait=0, warmup=1, active=2, record_shapes=True)
    whole = attribution.attribute(work, run).set_index("operator")
    split = attribution.attribute(work, run, by_shape=True)
    convs = split[split["operator"].str.startswith("aten::convolution")]
    assert sorted(convs["operator"]) == ["aten::convolution 2x3x16x16 · 8x3x3x3", "aten::convolution 2x8x16x16 · 8x8x3x3",
                                         "aten::convolution 2x8x8x8 · 8x8x3x3"]
    by_operator = split.assign(name=split["operator"].str.split(" ").str[0]).groupby("name")[
        ["flops", "bytes", "calls", "time_ms"]].sum()
    for name in ("aten::convolution", "aten::native_batch_norm", "aten::relu_"):
        for column in ("flops", "bytes", "calls", "time_ms"):
            assert by_operator.loc[name, column] == pytest.approx(whole.loc[name, column]), (name, column)
    bn = split[split["operator"].str.startswith("aten::native_batch_norm")]
    assert (bn["flops"] > 0).all() and list(split.columns)[-1] == "shapes"
    assert attribution.shape_label("aten::relu_", ((2, 8, 8, 8),)) == "aten::relu_ 2x8x8x8"
    assert attribution.shape_label("aten::mean", None) == "aten::mean (shapes not recorded)"


def test_point_labels_stay_inside_the_axes():
    # Long labels (operator and shapes) on points at the right edge: drawn to their left, or not at all.
    rows = [{"operator": f"aten::convolution 64x{256 + i}x56x56 · 64x{256 + i}x1x1", "category": "GEMM (projections)",
             "flops": 1e12 * (1 + i), "bytes": 1e9 * (1 + 0.1 * i), "time_ms": 10.0 + i, "precision": "tf32",
             "flop_source": "flop_counter"} for i in range(5)]
    points = roofline.classify(pd.DataFrame(rows), ROOFS).assign(label="net")
    fig, ax = plt.subplots(figsize=(8, 5))
    roofline.plot_roofline({"net": points}, ROOFS, ax=ax, top=5, label_width=42)
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    shown = [t for t in ax.texts if t.get_visible() and t.get_text().startswith("convolution")]
    assert shown, "no point label was placed"
    for text in shown:
        box = text.get_window_extent(renderer)
        assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, text.get_text()
    assert roofline.overlapping_labels(fig) == []
    plt.close(fig)
