"""sw.onnx.kernels against onnxruntime itself: the requantization the NPU reproduces equals
onnxruntime's bit for bit on the accumulators where the order of its float32 steps
matters."""

import numpy as np
from onnx import helper

from sw.onnx import kernels as K
from onnx_helpers import constant, model, run_ort

f32 = np.float32


def _scales(rng, size=None, low=-9.0, high=0.0):
    return np.exp(rng.uniform(low, high, size)).astype(f32)


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
        got = K.requantize_output(chosen, K.requant_scale(a_scale, b_scale, y_scale), 0, np.int8)
        np.testing.assert_array_equal(got, expected)
        tested += len(chosen)
    assert wrong["(a*b)/y"] == 0
    assert wrong["a*(b/y)"] > 0 and wrong["(a/y)*b"] > 0     # the test can tell them apart
