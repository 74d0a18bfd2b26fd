"""sw.onnx.kernels against onnxruntime itself: each kernel's output equals onnxruntime's bit
for bit on random operands (seeds in the test ids) and on chosen edge cases."""

from fractions import Fraction

import numpy as np
import pytest
from onnx import helper

from sw.onnx import kernels as K
from onnx_helpers import constant, model, run_ort

f32 = np.float32
SEEDS = range(4)


def _scales(rng, size=None, low=-9.0, high=0.0):
    return np.exp(rng.uniform(low, high, size)).astype(f32)


def test_fma32_rounds_once():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(20000).astype(f32)
    b = rng.standard_normal(20000).astype(f32)
    c = (rng.standard_normal(20000) * 1e-3).astype(f32)
    # Values whose float64 sum lands on a float32 tie: a*b exactly halfway plus a tiny c.
    a[:4] = f32(1 + 2 ** -12)
    b[:4] = f32(1 + 2 ** -12)          # product 1 + 2^-11 + 2^-24: a float32 tie
    c[:4] = f32([2 ** -60, -2 ** -60, 0, 2 ** -80])
    got = K.fma32(a, b, c)
    for i in list(range(8)) + list(rng.integers(8, 20000, 200)):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        below = f32(float(exact))          # nearest float64, then float32: check by bracketing
        candidates = {below, np.nextafter(below, f32(np.inf)), np.nextafter(below, f32(-np.inf))}
        best = min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact),
                                              int(np.array(v).view(np.uint32)) & 1))
        assert got[i] == best, (i, a[i], b[i], c[i])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_conv(seed, dtype):
    rng = np.random.default_rng(seed)
    lowest, highest = K.qtype_range(dtype)
    channels, out_channels = int(rng.integers(1, 9)), int(rng.integers(1, 9))
    x = rng.integers(lowest, highest + 1, (2, channels, 7, 6)).astype(dtype)
    # u8 x s8 products: onnxruntime's AVX2 kernel (vpmaddubsw) saturates pairs of products
    # at 16 bits; weights within +-64 (reduce_range) keep it exact. s8 x s8 has no limit.
    limit = 127 if dtype == np.int8 else 64
    w = rng.integers(-limit, limit + 1, (out_channels, channels, 3, 3)).astype(np.int8)
    xs, ws, ys = f32(rng.uniform(1e-3, 0.1)), _scales(rng, out_channels, -7, -3), f32(rng.uniform(0.01, 1))
    xz, yz = dtype(rng.integers(lowest, highest + 1)), dtype(rng.integers(lowest, highest + 1))
    bias = rng.integers(-5000, 5000, out_channels).astype(np.int32)
    attrs = dict(pads=[1, 0, 1, 2], strides=[2, 1])
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], **attrs)
    onnx_model = model([node], [("x", dtype, list(x.shape))], [("y", dtype, None)],
                       [constant("xs", xs), constant("xz", xz), constant("w", w),
                        constant("ws", ws), constant("wz", np.zeros(out_channels, np.int8)),
                        constant("ys", ys), constant("yz", yz), constant("b", bias)])
    (expected,) = run_ort(onnx_model, {"x": x})
    got = K.qlinear_conv(x, xs, xz, w, ws, np.zeros(out_channels, np.int8), ys, yz, bias, attrs)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("seed", SEEDS)
def test_qlinear_matmul_and_matmul_integer(seed):
    rng = np.random.default_rng(seed)
    m, k, n = 5, int(rng.integers(1, 40)), int(rng.integers(1, 9))
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    b = rng.integers(-127, 128, (k, n)).astype(np.int8)
    a_scale, b_scale, y_scale = _scales(rng), _scales(rng, n, -9, -2), _scales(rng, None, -6, 1)
    az, yz = np.int8(rng.integers(-128, 128)), np.int8(rng.integers(-128, 128))
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    onnx_model = model([node], [("a", np.int8, [m, k])], [("y", np.int8, [m, n])],
                       [constant("as", a_scale), constant("az", az), constant("b", b),
                        constant("bs", b_scale), constant("bz", np.zeros(n, np.int8)),
                        constant("ys", y_scale), constant("yz", yz)])
    (expected,) = run_ort(onnx_model, {"a": a})
    np.testing.assert_array_equal(
        K.qlinear_matmul(a, a_scale, az, b, b_scale, np.zeros(n, np.int8), y_scale, yz), expected)

    node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
    bz = np.int8(rng.integers(-128, 128))
    onnx_model = model([node], [("a", np.int8, [m, k])], [("y", np.int32, [m, n])],
                       [constant("b", b), constant("az", az), constant("bz", bz)])
    (expected,) = run_ort(onnx_model, {"a": a})
    np.testing.assert_array_equal(K.matmul_integer(a, b, az, bz), expected)


def test_requant_scale_is_left_to_right_float32():
    """QGemm with an INT32 C that sets the accumulators: accumulators are chosen where the
    orders of evaluating a_scale * b_scale / y_scale give different outputs; onnxruntime
    agrees with (a_scale * b_scale) / y_scale on every one of them."""
    rng = np.random.default_rng(3)
    orders = {"(a*b)/y": lambda a, b, y: (a * b) / y, "a*(b/y)": lambda a, b, y: a * (b / y),
              "(a/y)*b": lambda a, b, y: (a / y) * b}
    wrong = dict.fromkeys(orders, 0)
    tested = 0
    while tested < 20:
        a_scale, b_scale, y_scale = _scales(rng), _scales(rng, None, -9, -2), _scales(rng, None, -6, 1)
        scales = {name: f32(order(a_scale, b_scale, y_scale)) for name, order in orders.items()}
        if len(set(scales.values())) == 1:
            continue
        acc = rng.integers(-2 ** 26, 2 ** 26, 200000).astype(np.int32)
        results = {name: K.requantize_output(acc, s, 0, np.int8) for name, s in scales.items()}
        differs = np.zeros(acc.shape, bool)
        for result in results.values():
            differs |= result != results["(a*b)/y"]
        chosen = acc[differs][:16].reshape(-1, 1)
        if not len(chosen):
            continue
        node = helper.make_node("QGemm", ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"],
                                ["y"], domain="com.microsoft")
        onnx_model = model(
            [node], [("a", np.int8, [len(chosen), 1])], [("y", np.int8, [len(chosen), 1])],
            [constant("as", a_scale), constant("az", np.int8(0)),
             constant("b", np.ones((1, 1), np.int8)), constant("bs", b_scale),
             constant("bz", np.int8(0)), constant("c", chosen), constant("ys", y_scale),
             constant("yz", np.int8(0))], microsoft=True)
        (expected,) = run_ort(onnx_model, {"a": np.zeros((len(chosen), 1), np.int8)})
        for name, s in scales.items():
            wrong[name] += int(np.sum(K.requantize_output(chosen, s, 0, np.int8) != expected))
        got = K.qgemm(np.zeros((len(chosen), 1), np.int8), a_scale, 0, np.ones((1, 1), np.int8),
                      b_scale, 0, chosen, y_scale, np.int8(0))
        np.testing.assert_array_equal(got, expected)
        tested += len(chosen)
    assert wrong["(a*b)/y"] == 0
    assert wrong["a*(b/y)"] > 0 and wrong["(a/y)*b"] > 0     # the test can tell them apart


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_dequantize_linear(seed, dtype):
    rng = np.random.default_rng(seed)
    lowest, highest = K.qtype_range(dtype)
    scale, zp = _scales(rng, None, -6, 0), dtype(rng.integers(lowest, highest + 1))
    x = (rng.standard_normal((3, 4, 5, 7)) * 40 * scale).astype(f32)
    x.flat[:6] = (np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1e9]) * scale).astype(f32)    # ties
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])
    onnx_model = model([node], [("x", np.float32, list(x.shape))], [("q", dtype, None)],
                       [constant("s", scale), constant("z", zp)])
    (expected,) = run_ort(onnx_model, {"x": x})
    np.testing.assert_array_equal(K.quantize_linear(x, scale, zp), expected)

    q = rng.integers(lowest, highest + 1, (3, 4, 5)).astype(dtype)
    channel_scale = _scales(rng, 4, -6, 0)
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["x"], axis=1)
    onnx_model = model([node], [("q", dtype, list(q.shape))], [("x", np.float32, None)],
                       [constant("s", channel_scale), constant("z", np.full(4, zp, dtype))])
    (expected,) = run_ort(onnx_model, {"q": q})
    np.testing.assert_array_equal(K.dequantize_linear(q, channel_scale, np.full(4, zp, dtype)),
                                  expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("shape_b", ["same", "scalar"])
def test_qlinear_add(seed, dtype, shape_b):
    rng = np.random.default_rng(seed)
    lowest, highest = K.qtype_range(dtype)
    a = rng.integers(lowest, highest + 1, (2, 3, 9, 7)).astype(dtype)
    b = (rng.integers(lowest, highest + 1, a.shape) if shape_b == "same"
         else rng.integers(lowest, highest + 1, ())).astype(dtype)
    scales = _scales(rng, 3, -5, 0)
    zps = [dtype(v) for v in rng.integers(lowest, highest + 1, 3)]
    node = helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"],
                            domain="com.microsoft")
    onnx_model = model([node], [("a", dtype, list(a.shape))], [("c", dtype, None)],
                       [constant("as", scales[0]), constant("az", zps[0]), constant("b", b),
                        constant("bs", scales[1]), constant("bz", zps[1]),
                        constant("cs", scales[2]), constant("cz", zps[2])], microsoft=True)
    (expected,) = run_ort(onnx_model, {"a": a})
    got = K.qlinear_add(a, scales[0], zps[0], b, scales[1], zps[1], scales[2], zps[2])
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_max_pool_and_conv_integer(dtype):
    rng = np.random.default_rng(7)
    lowest, highest = K.qtype_range(dtype)
    x = rng.integers(lowest, highest + 1, (2, 3, 9, 8)).astype(dtype)
    attrs = dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])
    node = helper.make_node("MaxPool", ["x"], ["y"], **attrs)
    onnx_model = model([node], [("x", dtype, list(x.shape))], [("y", dtype, None)], [],
                       opset=12)
    (expected,) = run_ort(onnx_model, {"x": x})
    np.testing.assert_array_equal(K.max_pool(x, attrs), expected)

    w = rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    xz = dtype(rng.integers(lowest, highest + 1))
    conv_attrs = dict(pads=[1, 1, 1, 1], strides=[1, 2])
    node = helper.make_node("ConvInteger", ["x", "w", "xz"], ["y"], **conv_attrs)
    onnx_model = model([node], [("x", dtype, list(x.shape))], [("y", np.int32, None)],
                       [constant("w", w), constant("xz", xz)])
    try:
        (expected,) = run_ort(onnx_model, {"x": x})
    except Exception as error:       # onnxruntime implements ConvInteger for uint8 only
        assert "NOT_IMPLEMENTED" in str(error) and dtype == np.int8
        return
    np.testing.assert_array_equal(K.conv_integer(x, w, xz, 0, conv_attrs), expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_global_average_pool(seed, dtype):
    rng = np.random.default_rng(seed)
    lowest, highest = K.qtype_range(dtype)
    x = rng.integers(lowest, highest + 1, (2, 5, int(rng.integers(1, 9)), 7)).astype(dtype)
    xs, ys = _scales(rng, None, -5, 0), _scales(rng, None, -5, 0)
    xz, yz = dtype(rng.integers(lowest, highest + 1)), dtype(rng.integers(lowest, highest + 1))
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"],
                            domain="com.microsoft", channels_last=0)
    onnx_model = model([node], [("x", dtype, list(x.shape))], [("y", dtype, None)],
                       [constant("xs", xs), constant("xz", xz), constant("ys", ys),
                        constant("yz", yz)], microsoft=True)
    (expected,) = run_ort(onnx_model, {"x": x})
    np.testing.assert_array_equal(K.qlinear_global_average_pool(x, xs, xz, ys, yz), expected)
