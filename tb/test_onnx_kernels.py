"""sw.onnx.kernels against onnxruntime itself: each kernel's output equals onnxruntime's bit
for bit on random operands (seeds in the test ids) and on chosen edge cases."""

import math
from fractions import Fraction

import numpy as np
import pytest
from onnx import helper

from sw.errors import NPUValueError
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


def _run_microsoft(op, x, constants, **attrs):
    """onnxruntime's output of one com.microsoft node ``op`` whose first input is ``x`` (the
    graph's input) and whose other inputs are the ``(name, value)`` pairs ``constants``."""
    node = helper.make_node(op, ["x"] + [name for name, _ in constants], ["y"],
                            domain="com.microsoft", **attrs)
    onnx_model = model([node], [("x", x.dtype, list(x.shape))], [("y", x.dtype, None)],
                       [constant(name, value) for name, value in constants], microsoft=True)
    return run_ort(onnx_model, {"x": x})[0]


def _concat_ort(y_scale, y_zp, inputs, axis):
    """QLinearConcat's inputs are (y_scale, y_zp, then x, scale, zp per tensor); the test
    model takes the first tensor as the graph input through an Identity."""
    names, constants = ["ys", "yz"], [constant("ys", y_scale), constant("yz", y_zp)]
    for index, (x, scale, zp) in enumerate(inputs):
        names += [f"x{index}" if index else "x0", f"s{index}", f"z{index}"]
        constants += [constant(f"s{index}", scale), constant(f"z{index}", zp)]
        if index:
            constants.append(constant(f"x{index}", x))
    node = helper.make_node("QLinearConcat", names, ["y"], domain="com.microsoft", axis=axis)
    first = inputs[0][0]
    onnx_model = model([node], [("x0", first.dtype, list(first.shape))],
                       [("y", first.dtype, None)], constants, microsoft=True)
    return run_ort(onnx_model, {"x0": first})[0]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_concat(seed, dtype):
    """Three inputs: one at the output's own scale and zero point (onnxruntime copies it),
    one at half the output's scale (every odd ``q - zp`` lands on a tie), one random."""
    rng = np.random.default_rng(seed)
    lowest, highest = K.qtype_range(dtype)
    axis = int(rng.integers(-3, 3))
    y_scale, y_zp = _scales(rng, None, -5, 0), dtype(rng.integers(lowest, highest + 1))
    params = [(y_scale, y_zp), (f32(y_scale / 2), dtype(rng.integers(lowest, highest + 1))),
              (_scales(rng, None, -5, 0), dtype(rng.integers(lowest, highest + 1)))]
    inputs = []
    for scale, zp in params:
        shape = [2, 3, 4]
        shape[axis] = int(rng.integers(1, 5))
        inputs.append((rng.integers(lowest, highest + 1, shape).astype(dtype), scale, zp))
    inputs[1][0].flat[:6] = (np.array([1, -1, 3, -3, 5, 7]) + int(params[1][1])).clip(
        lowest, highest)                                     # q - zp odd: x.5 exactly
    expected = _concat_ort(y_scale, y_zp, inputs, axis)
    got = K.qlinear_concat(y_scale, y_zp, inputs, axis)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_concat_equal_and_different_scales(dtype):
    """Every input at the output's scale (copies), then the same scale with another zero
    point and another scale with the same zero point (tables)."""
    rng = np.random.default_rng(11)
    lowest, highest = K.qtype_range(dtype)
    y_scale, y_zp = f32(0.05), dtype(3)
    tensors = [rng.integers(lowest, highest + 1, (2, 3, 5)).astype(dtype) for _ in range(3)]
    for params in ([(y_scale, y_zp)] * 3,
                   [(y_scale, y_zp), (y_scale, dtype(-7 if dtype == np.int8 else 9)),
                    (f32(0.07), y_zp)]):
        inputs = [(x, scale, zp) for x, (scale, zp) in zip(tensors, params)]
        expected = _concat_ort(y_scale, y_zp, inputs, 1)
        np.testing.assert_array_equal(K.qlinear_concat(y_scale, y_zp, inputs, 1), expected)


def _pool_case(rng, dtype, spatial=2, *, ceil_mode=0, channels_last=0, count_include_pad=None):
    """Random pooling attributes and an input the kernel covers at least once (onnxruntime
    divides by zero on an empty output with channels_last)."""
    kernel = [int(rng.integers(1, 4)) for _ in range(spatial)]
    attrs = dict(kernel_shape=kernel, strides=[int(rng.integers(1, 4)) for _ in kernel],
                 pads=[int(rng.integers(0, k)) for k in kernel * 2], ceil_mode=ceil_mode,
                 count_include_pad=int(rng.integers(0, 2)) if count_include_pad is None
                 else count_include_pad, channels_last=channels_last)
    image = [int(rng.integers(k, 10)) for k in kernel]
    shape = [2] + image + [3] if channels_last else [2, 3] + image
    lowest, highest = K.qtype_range(dtype)
    return rng.integers(lowest, highest + 1, shape).astype(dtype), attrs


def _quant_params(rng, dtype):
    lowest, highest = K.qtype_range(dtype)
    return (_scales(rng, None, -5, 0), dtype(rng.integers(lowest, highest + 1)),
            _scales(rng, None, -5, 0), dtype(rng.integers(lowest, highest + 1)))


def _check_average_pool(x, params, attrs):
    xs, xz, ys, yz = params
    expected = _run_microsoft("QLinearAveragePool", x,
                              [("xs", xs), ("xz", xz), ("ys", ys), ("yz", yz)], **attrs)
    got = K.qlinear_average_pool(x, xs, xz, ys, yz, attrs)
    assert got.shape == expected.shape, attrs
    np.testing.assert_array_equal(got, expected, err_msg=str(attrs))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_qlinear_average_pool(seed, dtype, count_include_pad):
    """2-D NCHW, random kernel, strides and padding (each pad smaller than the kernel, as
    onnxruntime requires), in both counting modes."""
    rng = np.random.default_rng(seed)
    for _ in range(3):
        x, attrs = _pool_case(rng, dtype, count_include_pad=count_include_pad)
        _check_average_pool(x, _quant_params(rng, dtype), attrs)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_average_pool_layouts_and_modes(dtype):
    """ceil_mode (onnxruntime drops a last window that starts in the tail padding),
    channels_last, 1-D and 3-D pooling, the global-pool shortcut (kernel = image, no
    padding: onnxruntime sums in INT32 there), and a stride larger than the kernel."""
    rng = np.random.default_rng(5)
    for spatial, ceil_mode, channels_last in [(2, 1, 0), (2, 0, 1), (2, 1, 1), (1, 0, 0),
                                              (1, 1, 0), (3, 0, 0), (3, 1, 1)] * 3:
        x, attrs = _pool_case(rng, dtype, spatial, ceil_mode=ceil_mode,
                              channels_last=channels_last)
        _check_average_pool(x, _quant_params(rng, dtype), attrs)
    x = rng.integers(*K.qtype_range(dtype), (2, 3, 4, 5)).astype(dtype)
    _check_average_pool(x, _quant_params(rng, dtype), dict(kernel_shape=[4, 5]))
    _check_average_pool(x, _quant_params(rng, dtype),
                        dict(kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1]))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_average_pool_ties(dtype):
    """Scales that are powers of two make every step exact: averages of 2 and 4 pixels
    land on x.5 (rounded half to even), with and without the padding in the count."""
    rng = np.random.default_rng(9)
    lowest, highest = K.qtype_range(dtype)
    x = rng.integers(lowest, highest + 1, (1, 4, 6, 7)).astype(dtype)
    params = (f32(0.125), dtype(lowest + 3), f32(0.125), dtype(lowest + 100))
    for include in (0, 1):
        attrs = dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1],
                     count_include_pad=include)
        _check_average_pool(x, params, attrs)
    # Inner windows whose sum of (q - zp) is 2 mod 4 average to x.5 exactly.
    sums = (x[:, :, :6, :6].astype(int) - int(params[1])).reshape(1, 4, 3, 2, 3, 2)
    assert np.any(sums.sum(axis=(3, 5)) % 4 == 2)


def test_qlinear_average_pool_arithmetic():
    """3x3 windows (9 pixels, no padding) chosen where a float32 sum in another order,
    multiplying by the reciprocal of the count, or quantizing in float64 would give another
    output than the kernel (row-major float32 sum, float32 division by the count,
    ``nearbyintf(avg / y_scale + zp)`` in float32); onnxruntime agrees with the kernel on
    every one of them, and each candidate is wrong on some."""
    rng = np.random.default_rng(4)
    f64 = np.float64
    candidates = {
        "column-major sum": lambda w, ys, zp: (_sum32(w.reshape(-1, 3, 3).transpose(0, 2, 1)
                                               .reshape(-1, 9)) / f32(9)) / ys + f32(zp),
        "reciprocal": lambda w, ys, zp: (_sum32(w) * (f32(1) / f32(9))) / ys + f32(zp),
        "float64": lambda w, ys, zp: f32(f64(_sum32(w)) / 9 / f64(ys) + zp),
    }
    tested = dict.fromkeys(candidates, 0)
    wrong = dict.fromkeys(candidates, 0)
    while min(tested.values()) < 8:
        # y_scale puts the average of windows whose codes sum to `target` (a common sum)
        # within float32 rounding of a tie, k + 0.5, where the candidates part ways.
        xs, xz, yz = _scales(rng, None, -5, 0), np.uint8(128), np.uint8(128)
        codes = rng.integers(0, 256, (20000, 9)).astype(np.uint8)
        target = int(rng.integers(50, 300))
        ys = f32(xs * target / 9 / (int(rng.integers(1, 100)) + 0.5))
        windows = K.dequantize_linear(np.arange(256, dtype=np.uint8), xs, xz)[codes]
        kernel = _to_uint8((_sum32(windows) / f32(9)) / ys + f32(yz))
        for name, candidate in candidates.items():
            differs = _to_uint8(candidate(windows, ys, yz)) != kernel
            chosen = codes[differs][:8]
            if not len(chosen):
                continue
            # The windows side by side along the width, (1, 1, 3, 3n) with kernel and stride
            # 3, and one more window: a single one would be onnxruntime's global pool.
            x = np.concatenate([chosen, codes[:1]]).reshape(1, -1, 3, 3).transpose(0, 2, 1, 3)
            x = x.reshape(1, 1, 3, -1)
            attrs = dict(kernel_shape=[3, 3], strides=[3, 3])
            expected = _run_microsoft("QLinearAveragePool", x,
                                      [("xs", xs), ("xz", xz), ("ys", ys), ("yz", yz)],
                                      **attrs)
            np.testing.assert_array_equal(K.qlinear_average_pool(x, xs, xz, ys, yz, attrs),
                                          expected)
            values = _to_uint8(candidate(K.dequantize_linear(chosen, xs, xz), ys, yz))
            wrong[name] += int(np.sum(values != expected.reshape(-1)[:-1]))
            tested[name] += len(chosen)
    assert wrong == tested, (wrong, tested)       # every chosen window refutes its candidate


def _to_uint8(value):
    return np.clip(np.rint(value), 0, 255).astype(np.uint8)


def _sum32(windows):
    """Float32 sums of each row, left to right from 0."""
    total = np.zeros(len(windows), f32)
    for column in range(windows.shape[1]):
        total = (total + windows[:, column]).astype(f32)
    return total


@pytest.mark.parametrize("attrs, message", [
    (dict(kernel_shape=[2, 2], dilations=[2, 1]), "dilations"),
    (dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER"), "auto_pad SAME_UPPER"),
    (dict(kernel_shape=[2, 2], pads=[2, 0, 0, 0]), "pads .* smaller than the kernel"),
    (dict(kernel_shape=[2, 2, 2, 2]), "kernel_shape"),
])
def test_qlinear_average_pool_refuses(attrs, message):
    x = np.zeros((1, 2, 5, 5), np.uint8)
    with pytest.raises(NPUValueError, match=f"QLinearAveragePool: {message}"):
        K.qlinear_average_pool(x, f32(0.1), np.uint8(0), f32(0.1), np.uint8(0), attrs)


def _check_softmax(x, params, **attrs):
    xs, xz, ys, yz = params
    expected = _run_microsoft("QLinearSoftmax", x,
                              [("xs", xs), ("xz", xz), ("ys", ys), ("yz", yz)], **attrs)
    got = K.qlinear_softmax(x, xs, xz, ys, yz, attrs.get("axis", -1), attrs["opset"])
    np.testing.assert_array_equal(got, expected, err_msg=str(attrs))
    return expected


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_softmax(seed, dtype):
    """Random rows of 1 to 40 values (a quarter of them clustered near the top, where the
    exp table's upper end matters), on the last axis, a middle axis (onnxruntime transposes
    it to the end) and, for opset 12, everything from the axis on."""
    rng = np.random.default_rng(seed)
    lowest, highest = K.qtype_range(dtype)
    for axis, opset in [(-1, 13), (1, 13), (1, 12)]:
        shape = [int(rng.integers(1, 4)), int(rng.integers(1, 41)), int(rng.integers(1, 5))]
        x = rng.integers(lowest, highest + 1, [200] + shape).astype(dtype)
        x[:50] = np.clip(x[:50] // 8 + highest - 31, lowest, highest)
        params = (_scales(rng, None, -6, 1), dtype(rng.integers(lowest, highest + 1)),
                  _scales(rng, None, -7, -1), dtype(rng.integers(lowest, highest + 1)))
        _check_softmax(x, params, axis=axis + (axis >= 0), opset=opset)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_softmax_saturated_max(dtype):
    """quantize_static's output parameters (1/256 with zero point 0 or -128, and the 1/255
    of the QDQ uint8 format) on rows whose maximum takes (almost) all the mass: onnxruntime
    saturates it to 255 or 127 (older releases wrapped int8 to -128) and, with 1/255,
    multiplies by floorf(1.0f / y_scale) = 254."""
    lowest, highest = K.qtype_range(dtype)
    x = np.full((4, 6), lowest, dtype)
    x[:, 0] = highest
    x[1, 1], x[2, 1:3], x[3, 1] = highest, highest - 2, highest - 40
    y_zp = dtype(lowest)
    for y_scale in (f32(1 / 256), f32(1 / 255)):
        expected = _check_softmax(x, (f32(0.2), dtype(0), y_scale, y_zp), axis=-1, opset=13)
        assert expected[0, 0] == (highest if y_scale == f32(1 / 256) else lowest + 254)


def test_qlinear_softmax_arithmetic():
    """Two steps the source leaves open, settled against onnxruntime 1.32 on inputs where
    the candidates differ: the quotient in float64 (onnxruntime's machine code) rather than
    float32 (older releases' source), and ``floorf(1.0f / y_scale)`` in float32 rather than
    float64 (y_scale = float32(1/3): 3 against 2)."""
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, (20000, 7)).astype(np.uint8)
    x_scale = f32(0.05)
    table = K._softmax_exp_table(x_scale, 7)
    e = table[255 - (x.max(axis=1, keepdims=True).astype(int) - x)]
    total = _sum32(e)
    single = np.rint(((e * f32(256)).astype(f32) / total[:, None]).astype(f32))
    double = np.rint(e.astype(np.float64) * 256 / total[:, None].astype(np.float64))
    differs = np.any(single != double, axis=1)
    rows = x[differs][:30]
    assert len(rows)
    expected = _check_softmax(rows, (x_scale, np.uint8(0), f32(1 / 256), np.uint8(0)),
                              axis=-1, opset=13)
    assert np.all(np.any(expected != np.clip(single[differs][:30], 0, 255), axis=1))

    third = _check_softmax(x[:50], (x_scale, np.uint8(0), f32(1 / 3), np.uint8(0)),
                           axis=-1, opset=13)
    assert third.max() == 3                                  # floor(2.99999994) would be 2


def test_qlinear_softmax_table_shift_is_logf():
    """The exp table's shift is ``logf(FLT_MAX / D)`` from the C library, as onnxruntime
    calls it, not ``log`` rounded to float32. They first differ at D = 60594; a row of that
    length in [250, 255] with y_scale 2^-23 puts its outputs mid-range, and among random
    x_scales a few give different outputs for the two shifts: onnxruntime agrees with
    ``logf`` on them."""
    length = 60594
    quotient = f32(np.finfo(f32).max / f32(length))
    shifts = {"logf": float(K._LOGF(quotient)), "log": float(f32(np.log(np.float64(quotient))))}
    assert shifts["logf"] != shifts["log"]
    rng = np.random.default_rng(12)
    x = rng.integers(250, 256, (1, length)).astype(np.uint8)
    x[0, 0] = 255
    column = x[0].astype(int) - 250
    scales = _scales(rng, 1000, -6, 0)
    factor = float(np.floor(f32(1) / f32(2 ** -23)))
    outputs = {}
    for name, shift in shifts.items():
        entries = np.array([[math.exp((i - 255.0 + max(0.0, shift - 5.0) / float(scale))
                                      * float(scale)) for i in range(250, 256)]
                            for scale in scales]).astype(f32)
        total = np.zeros(len(scales), f32)
        for index in column:                        # float32, left to right along the row
            total = (total + entries[:, index]).astype(f32)
        outputs[name] = np.rint(entries.astype(np.float64) * factor
                                / total[:, None].astype(np.float64))[:, column]
    chosen = np.nonzero(np.any(outputs["logf"] != outputs["log"], axis=1))[0][:4]
    assert len(chosen)
    for index in chosen:
        params = (scales[index], np.uint8(0), f32(2 ** -23), np.uint8(0))
        expected = _check_softmax(x, params, axis=-1, opset=13)
        assert np.any(expected[0] != np.clip(outputs["log"][index], 0, 255))
