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
    """Add the ``onnx`` command to the ``npu`` parser's ``commands``."""
    from ..cli import positive_int
    command = commands.add_parser(
        "onnx", help="run a quantized ONNX model (QDQ or QOperator) on the NPU")
    command.add_argument("model", metavar="MODEL.onnx", help="the model")
    command.add_argument("--input", metavar="X.npy",
                         help="the model's first input, in its dtype (float32 for QDQ); any "
                              "batch size")
    command.add_argument("--out", metavar="Y.npy",
                         help="write the output: one output to Y.npy, several to one Y.npz "
                              "archive (by their names); the suffix is appended to a name "
                              "without it, as numpy.save and numpy.savez do; not one of the "
                              "input files")
    add_config_arguments(command)
    command.add_argument("--sim", choices=("model", "verilator", "icarus", "soc", "board"),
                         default="model", help="where the NPU groups run (default model)")
    command.add_argument("--batch", type=positive_int, default=64,
                         help="samples per NPU program (default 64)")
    command.add_argument("--check", action="store_true",
                         help="also run onnxruntime (CPU) and require equal outputs")
    command.add_argument("--json", action="store_true", help="print one JSON object")
    command.add_argument("--plan", action="store_true",
                         help="print placement, NPU groups and DRAM plan; run nothing")
    command.add_argument("--calibrate", metavar="DATA.npy",
                         help="the model is float: quantize it first with onnxruntime's "
                              "quantize_static on these samples (float32, batch first; a "
                              "model with a fixed batch B takes them B at a time, and a "
                              "remainder of fewer than B samples is not used)")
    command.add_argument("--format", choices=("qdq", "qoperator"), default="qdq",
                         help="quantization format for --calibrate (default qdq)")
    command.add_argument("--profile", metavar="REPORT.md",
                         help="write the per-node profile (cycles, utilization, stalls, DRAM "
                              "bytes, time) with a roofline and a bar chart beside it "
                              "(REPORT.roofline.png, REPORT.layers.png); --json has it too")
    command.add_argument("--clock-mhz", type=float, metavar="F",
                         help="the NPU's clock for the profile's times (default: the "
                              "config's measured Fmax on ECP5, docs/fpga.md)")
    return command


def _profile_file(path):
    """``--profile``'s file, checked before anything runs."""
    if not path.lower().endswith(".md"):
        raise NPUValueError(f"--profile {path}: the report is Markdown; give a name ending "
                            f"in .md")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise NPUValueError(f"--profile {path}: no such directory {os.path.dirname(path)}")
    return path


def _placeholder_input(graph):
    name, dtype, shape = graph.inputs[0]
    dims = [d if isinstance(d, int) and d > 0 else 1 for d in shape]
    return np.zeros(dims, dtype=dtype or np.float32)


def _onnxruntime_outputs(path, x, input_name):
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {input_name: x})))


def _quantized(arguments, folder):
    """Quantize the float model ``arguments.model`` with ``--calibrate``'s samples into
    ``folder``; the quantized file's path. Errors name the user's files, never the temporary
    one."""
    from ..cli import load_npy
    from .models import quantize
    data = load_npy("--calibrate", arguments.calibrate)
    target = os.path.join(folder, "quantized.onnx")
    try:
        quantize(arguments.model, target, data, fmt=arguments.format)
    except NPUValueError as error:
        raise NPUValueError(f"--calibrate {arguments.calibrate}: {error}") from None
    except Exception as error:          # onnxruntime's and onnx's own exception types
        text = str(error).strip().splitlines()
        raise NPUValueError(f"{arguments.model}: onnxruntime's quantize_static failed: "
                            f"{text[0] if text else type(error).__name__}") from None
    return target


def run(arguments, config):
    """The ``onnx`` command; returns the exit status.

    Every file is checked before anything runs: the model, ``--input``, ``--calibrate`` and
    ``--out`` (its directory; ``.npy`` for a model with one output, ``.npz`` for several, by
    :func:`sw.cli.output_file`'s rule; none of the inputs). Errors name the user's model
    file, also after ``--calibrate`` quantized it into a temporary one.
    """
    from ..cli import load_npy, output_file, save_npy
    from .graph import import_model, load_model
    from .runtime import run_model
    model = load_model(arguments.model)
    out = None
    if arguments.out:
        names = [value.name for value in model.graph.output]
        several = len(names) > 1
        out = output_file(
            "--out", arguments.out, ".npz" if several else ".npy",
            {"MODEL.onnx": arguments.model, "--input": arguments.input,
             "--calibrate": arguments.calibrate},
            what=f"the model has {len(names)} outputs ({', '.join(names)})" if several
            else "the model has one output")
    report_path = _profile_file(arguments.profile) if arguments.profile else None
    if arguments.clock_mhz is not None and not arguments.clock_mhz > 0:
        raise NPUValueError(f"--clock-mhz must be positive, not {arguments.clock_mhz}")
    x = load_npy("--input", arguments.input) if arguments.input else None
    if x is None and not arguments.plan:
        raise NPUValueError("--input X.npy is required (or --plan)")
    with tempfile.TemporaryDirectory() as folder:
        path = arguments.model
        if arguments.calibrate:
            import onnx
            path = _quantized(arguments, folder)
            model = onnx.load(path)
        # The user's path, for messages, whichever file holds the model.
        graph = import_model(arguments.model, model=model)
        if arguments.plan:
            x = _placeholder_input(graph) if x is None else x
            from .runtime import check_input
            check_input(graph, x)
            from .plan import check_fits, plan_report, print_plan
            report = plan_report(graph, x, config, batch=arguments.batch, sim=arguments.sim)
            if arguments.json:
                print(json.dumps(report, indent=1))
            else:
                print_plan(report)
            check_fits(report)
            return 0
        run_result = run_model(graph, x, config=config, sim=arguments.sim,
                               batch=arguments.batch, progress=not arguments.json)
        verdict = None
        if arguments.check:
            try:
                expected = _onnxruntime_outputs(path, x, graph.inputs[0][0])
            except Exception as error:      # onnxruntime's own exception types
                text = str(error).strip().splitlines()
                raise NPUValueError(f"{arguments.model}: onnxruntime (--check) failed: "
                                    f"{text[0] if text else type(error).__name__}") from None
            verdict = {name: bool(value.dtype == expected[name].dtype
                                  and value.shape == expected[name].shape
                                  and np.array_equal(value, expected[name]))
                       for name, value in run_result.outputs.items()}
    if out is not None:
        outputs = run_result.outputs
        if len(outputs) == 1:
            save_npy("--out", out, next(iter(outputs.values())))
        else:
            try:
                with open(out, "wb") as file:       # exactly the file checked
                    np.savez(file, **outputs)
            except OSError as error:
                raise NPUValueError(f"--out {out}: cannot write ({error.strerror})") from None
    passed = verdict is None or all(verdict.values())
    report = written = None
    if report_path is not None or arguments.clock_mhz is not None:
        from ..profile import profile, write_report
        report = profile(run_result, config, clock_mhz=arguments.clock_mhz)
        if report_path is not None:
            written = write_report(report, report_path, title=(
                f"{os.path.basename(arguments.model)}, {len(x)} samples, {config.name}, "
                f"--sim {arguments.sim}"))
    if arguments.json:
        print(json.dumps({
            "model": arguments.model, "config": config.name, "sim": arguments.sim,
            "batch": int(len(x)),
            "placements": [p.__dict__ for p in run_result.placements],
            "groups": [[n.name for n in g.nodes] for g in run_result.groups],
            "npu_macs": run_result.npu_macs, "cpu_macs": run_result.cpu_macs,
            "npu_share": run_result.npu_share,
            "host_partitions": [step.names for step in run_result.partitions],
            "cycles": run_result.cycles, "cycles_predicted": run_result.cycles_predicted,
            "counters": run_result.counters,
            "programs": run_result.programs, "instructions": run_result.instructions,
            "check": verdict, "passed": passed, "out": out, "profile": report,
            "profile_files": written}, indent=1))
    else:
        npu = sum(p.device == "npu" for p in run_result.placements)
        print(f"{arguments.model}: {len(x)} samples, {npu} of {len(run_result.placements)} "
              f"nodes on the NPU ({run_result.npu_share:.1%} of the MACs: "
              f"{run_result.npu_macs} on the NPU, {run_result.cpu_macs} on the host), "
              f"{run_result.programs} programs, {len(run_result.partitions)} host partitions "
              f"on onnxruntime, cycles {run_result.cycles}")
        if verdict is not None:
            for name, equal in verdict.items():
                print(f"  {name}: {'equal to onnxruntime' if equal else 'DIFFERS from onnxruntime'}")
        if report is not None:
            t = report["totals"]
            print(f"  at {report['clock_mhz']} MHz: NPU {1e3 * t['npu_seconds']:.3f} ms, host "
                  f"{1e3 * t['host_seconds']:.3f} ms (measured)"
                  + (f"; profile in {', '.join(written)}" if written else ""))
    if not passed:
        print("npu: error: the outputs differ from onnxruntime's", file=sys.stderr)
        return 1
    return 0
