"""``make board-sim``: the whole SoC in simulation, end to end, as a board would run it.

A GEMM, a quantized convolution and a small quantized ONNX model run through the UART bridge,
LiteDRAM (with the ULX3S's SDRAM model) and the NPU of the simulated LiteX SoC
(:mod:`soc.simulation`), driven by the board backend (:mod:`sw.board`); each is compared bit
for bit with its reference (numpy, or onnxruntime for the model). For each it prints the
cycles the NPU counted, the cycle model's prediction for the project's simulated DRAM (the
SDRAM is slower: the difference is what it costs), and the bytes on the host link with the
time they take at the board's 3 Mbaud.

    python -m sw.board_demo [--config 4x4] [--gemm 64x64x64] [--json]
"""

import argparse
import json
import sys
import time

import numpy as np

from hw.config import NPUConfig
from .board import BAUDRATE


__all__ = ["main"]


def _gemm(config, m, k, n, seed):
    from .driver import gemm
    from .reference import reference_gemm
    from .timing import predict_gemm
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    result = gemm(a, b, config=config, sim="soc")
    return {"what": f"gemm {m}x{k}x{n}", "bit_exact": bool(np.array_equal(
        result.c, reference_gemm(a, b))), "cycles": result.cycles,
        "predicted_cycles_hdl_dram": predict_gemm(config, m, k, n).cycles,
        "utilization": result.utilization, "counters": result.perf, "link": result.link}


def _conv(config, seed):
    from .conv import conv2d
    from .reference import reference_conv2d
    rng = np.random.default_rng(seed)
    channels_in, channels_out, size = 8, 8, 8
    x = rng.integers(-128, 128, (1, size, size, channels_in), dtype=np.int8)
    w = rng.integers(-128, 128, (3, 3, channels_in, channels_out), dtype=np.int8)
    bias = rng.integers(-5000, 5000, channels_out, dtype=np.int32)
    scale = (rng.uniform(0.5, 2.0, channels_out) / (9 * channels_in * 128)).astype(np.float32)
    problem = dict(x=x, w=w, bias=bias, scale=scale, stride=1, padding=1, in_zero_point=-3,
                   out_zero_point=5, act_min=-128, act_max=127)
    result = conv2d(**problem, config=config, sim="soc")
    return {"what": f"quantized conv 3x3, {size}x{size}x{channels_in} -> {channels_out}",
            "bit_exact": bool(np.array_equal(result.y, reference_conv2d(**problem))),
            "cycles": result.cycles, "link": result.link}


def _onnx(config, seed):
    import os
    import tempfile
    from .onnx.graph import import_model
    from .onnx.models import build, calibration_data, quantize
    from .onnx.runtime import run_model
    import onnxruntime
    model, shape = build("mlp", seed=seed)
    with tempfile.TemporaryDirectory() as folder:
        float_path = os.path.join(folder, "mlp.onnx")
        quantized = os.path.join(folder, "mlp_int8.onnx")
        with open(float_path, "wb") as file:
            file.write(model.SerializeToString())
        quantize(float_path, quantized, calibration_data(shape), fmt="qdq")
        x = calibration_data(shape, samples=4, seed=seed + 1)
        outcome = run_model(import_model(quantized), x, config=config, sim="soc", batch=4)
        session = onnxruntime.InferenceSession(quantized, providers=["CPUExecutionProvider"])
        expected = session.run(None, {session.get_inputs()[0].name: x})
    equal = all(np.array_equal(value, reference) for value, reference in
                zip(outcome.outputs.values(), expected))
    return {"what": "ONNX mlp (QDQ, onnxruntime's quantize_static), 4 samples",
            "bit_exact": bool(equal), "cycles": outcome.cycles, "link": None}


def _print(row):
    line = f"{row['what']}: bit-exact {'yes' if row['bit_exact'] else 'NO'}, " \
           f"cycles {row['cycles']:,}"
    if "predicted_cycles_hdl_dram" in row:
        line += (f" (cycle model with the simulated DRAM: "
                 f"{row['predicted_cycles_hdl_dram']:,}), utilization {row['utilization']:.1%}")
    print(line)
    if row.get("link"):
        link = row["link"]
        print(f"  host link: {link['tx_bytes']:,} bytes to the SoC, {link['rx_bytes']:,} back; "
              f"{link['seconds_at_3mbaud']:.2f} s at {BAUDRATE / 1e6:g} Mbaud")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sw.board_demo", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--config", default="4x4", help="the NPU in the SoC (default 4x4)")
    parser.add_argument("--gemm", default="64x64x64", metavar="MxKxN",
                        help="the GEMM's shape (default 64x64x64)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only-gemm", action="store_true", help="skip the conv and the model")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    arguments = parser.parse_args(argv)
    config = NPUConfig.from_name(arguments.config)
    m, k, n = (int(part) for part in arguments.gemm.split("x"))
    started = time.perf_counter()
    rows = [_gemm(config, m, k, n, arguments.seed)]
    if not arguments.only_gemm:
        rows += [_conv(config, arguments.seed), _onnx(config, arguments.seed)]
    wall = time.perf_counter() - started
    if arguments.json:
        print(json.dumps({"config": config.name, "rows": rows, "wall_seconds": wall}))
    else:
        print(f"the simulated LiteX SoC with the {config.name} NPU (UARTBone, LiteDRAM "
              f"with the ULX3S's SDRAM model)")
        for row in rows:
            _print(row)
        print(f"wall time {wall:.0f} s")
    if not all(row["bit_exact"] for row in rows):
        print("board-sim: error: a result differs from its reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
