"""``npu onnx``: run a quantized ONNX model on the NPU, check it against onnxruntime.

::

    npu onnx MODEL.onnx --input X.npy [--out Y.npy] [--config 8x8] [--sim model] \
             [--check] [--json] [--batch 64]
    npu onnx MODEL.onnx --plan [--input X.npy]
    npu onnx FLOAT.onnx --calibrate DATA.npy [--format qdq] --input X.npy ...

Exit status: 0 on success (and, with ``--check``, only when every output equals
onnxruntime's bit for bit), 1 when the check fails or the NPU stopped with an error, 2 on bad
input (a one-line ``npu: error: ...``).
"""

import json
import os
import sys
import tempfile

import numpy as np

from ..errors import NPUValueError


__all__ = ["add_parser", "run"]


def add_parser(commands, add_config_arguments):
    command = commands.add_parser(
        "onnx", help="run a quantized ONNX model (QDQ or QOperator) on the NPU")
    command.add_argument("model", metavar="MODEL.onnx", help="the model")
    command.add_argument("--input", metavar="X.npy",
                         help="the model's first input, in its dtype (float32 for QDQ); any "
                              "batch size")
    command.add_argument("--out", metavar="Y.npy",
                         help="write the output (several outputs: an .npz)")
    add_config_arguments(command)
    command.add_argument("--sim", choices=("model", "verilator", "icarus", "soc", "board"),
                         default="model", help="where the NPU groups run (default model)")
    command.add_argument("--batch", type=int, default=64, help="samples per NPU program")
    command.add_argument("--check", action="store_true",
                         help="also run onnxruntime (CPU) and require equal outputs")
    command.add_argument("--json", action="store_true", help="print one JSON object")
    command.add_argument("--plan", action="store_true",
                         help="print placement, NPU groups and DRAM plan; run nothing")
    command.add_argument("--calibrate", metavar="DATA.npy",
                         help="the model is float: quantize it first with onnxruntime's "
                              "quantize_static on these samples")
    command.add_argument("--format", choices=("qdq", "qoperator"), default="qdq",
                         help="quantization format for --calibrate (default qdq)")
    return command


def _load_npy(option, path):
    if not os.path.isfile(path):
        raise NPUValueError(f"{option} {path}: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except Exception as error:
        raise NPUValueError(f"{option} {path}: not a .npy array ({error})") from None


def _placeholder_input(graph):
    name, dtype, shape = graph.inputs[0]
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in shape]
    return np.zeros(dims, dtype=dtype or np.float32)


def _onnxruntime_outputs(path, x, input_name):
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {input_name: x})))


def _plan_report(graph, x, config):
    from ..nn.program import build_fused_program
    from .lower import npu_groups, place_graph
    from .runtime import _group_input, infer_shapes
    shapes = infer_shapes(graph, x)
    placements = place_graph(graph, shapes)
    groups, _ = npu_groups(graph, placements, shapes)
    report = {"placements": [p.__dict__ for p in placements], "groups": []}
    for group in groups.values():
        image = build_fused_program(config, group.ops, _group_input(group, np.zeros(
            shapes[group.input], dtype=np.int8)))
        regions = {name: {"addr": addr, "bytes": size}
                   for name, (addr, size) in sorted(image.regions.items(),
                                                    key=lambda item: item[1][0])}
        report["groups"].append({
            "nodes": [node.name for node in group.nodes], "input": group.input,
            "output": group.output, "instructions": image.program_len,
            "dram_bytes": int(image.dram.size), "regions": regions})
    return report


def _print_plan(report, batch):
    print(f"placement (batch {batch}):")
    for p in report["placements"]:
        print(f"  {p['node']:<28} {p['op_type']:<16} {p['device'].upper():<4} {p['reason']}")
    for index, group in enumerate(report["groups"]):
        print(f"NPU group {index}: {' -> '.join(group['nodes'])}  "
              f"({group['instructions']} instructions, {group['dram_bytes']} bytes of DRAM)")
        for name, region in group["regions"].items():
            print(f"  0x{region['addr']:08x} {region['bytes']:>9} B  {name}")


def run(arguments, config):
    """The ``onnx`` command; returns the exit status."""
    from .graph import import_model
    from .runtime import run_model
    path = arguments.model
    with tempfile.TemporaryDirectory() as folder:
        if arguments.calibrate:
            from .graph import load_model
            from .models import quantize
            load_model(path)
            data = _load_npy("--calibrate", arguments.calibrate)
            target = os.path.join(folder, "quantized.onnx")
            try:
                quantize(path, target, data, fmt=arguments.format)
            except NPUValueError:
                raise
            except Exception as error:
                raise NPUValueError(f"{path}: onnxruntime's quantize_static failed: "
                                    f"{str(error).splitlines()[0] if str(error) else error}") \
                    from None
            path = target
        graph = import_model(path)
        x = _load_npy("--input", arguments.input) if arguments.input else None
        if arguments.plan:
            x = _placeholder_input(graph) if x is None else x
            from .runtime import check_input
            check_input(graph, x)
            report = _plan_report(graph, x, config)
            if arguments.json:
                print(json.dumps(report, indent=1))
            else:
                _print_plan(report, len(x))
            return 0
        if x is None:
            raise NPUValueError("--input X.npy is required (or --plan)")
        run_result = run_model(graph, x, config=config, sim=arguments.sim,
                               batch=arguments.batch)
        verdict = None
        if arguments.check:
            expected = _onnxruntime_outputs(path, x, graph.inputs[0][0])
            verdict = {name: bool(value.dtype == expected[name].dtype
                                  and value.shape == expected[name].shape
                                  and np.array_equal(value, expected[name]))
                       for name, value in run_result.outputs.items()}
    if arguments.out:
        outputs = run_result.outputs
        if len(outputs) == 1:
            np.save(arguments.out, next(iter(outputs.values())))
        else:
            np.savez(arguments.out, **outputs)
    passed = verdict is None or all(verdict.values())
    if arguments.json:
        print(json.dumps({
            "model": arguments.model, "config": config.name, "sim": arguments.sim,
            "batch": int(len(x)),
            "placements": [p.__dict__ for p in run_result.placements],
            "groups": [[n.name for n in g.nodes] for g in run_result.groups],
            "npu_macs": run_result.npu_macs, "cpu_macs": run_result.cpu_macs,
            "cycles": run_result.cycles, "cycles_predicted": run_result.cycles_predicted,
            "counters": run_result.counters,
            "programs": run_result.programs, "instructions": run_result.instructions,
            "check": verdict, "passed": passed}, indent=1))
    else:
        npu = sum(p.device == "npu" for p in run_result.placements)
        print(f"{arguments.model}: {len(x)} samples, {npu} of {len(run_result.placements)} "
              f"nodes on the NPU ({run_result.npu_macs} MACs; {run_result.cpu_macs} on the "
              f"CPU), {run_result.programs} programs, cycles {run_result.cycles}")
        if verdict is not None:
            for name, equal in verdict.items():
                print(f"  {name}: {'equal to onnxruntime' if equal else 'DIFFERS from onnxruntime'}")
    if not passed:
        print("npu: error: the outputs differ from onnxruntime's", file=sys.stderr)
        return 1
    return 0
