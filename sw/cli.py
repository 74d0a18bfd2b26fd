"""The ``npu`` command line: run GEMMs, write the Verilog, print a trace.

::

    npu gemm --m 64 --k 100 --n 100 --config 8x8 --sim model --seed 1 [--json]
    npu gemm --a A.npy --b B.npy [--out C.npy] --sim model
    npu qgemm --a A.npy --b B.npy --bias BIAS.npy --multiplier MULT.npy --shift SHIFT.npy \
              --out-zero-point Z --act-min LO --act-max HI [--a-zero-point ZA] \
              --config 8x8 --sim model [--out Y.npy] [--json]
    npu qgemm --m 64 --k 100 --n 100 --seed 1 --sim model        (random operands)
    npu verilog --config 8x8 -o npu_8x8.v
    npu trace
    npu bench [--quick] [--out docs/performance.md] [--no-speed]
    npu onnx MODEL.onnx --input X.npy [--out Y.npy] --config 8x8 --sim model [--check] [--json]
    npu onnx MODEL.onnx --plan                        (see sw.onnx.command)
    npu gemm --m 64 --k 64 --n 64 --config 8x8 --sim board --port /dev/ttyUSB0 [--soc soc.json]
    npu gemm --m 64 --k 64 --n 64 --config 2x2 --sim soc       (the simulated LiteX SoC)
    npu board probe --port /dev/ttyUSB0                (the board's NPU and config)

``--out`` follows numpy's naming (``C`` writes ``C.npy``; several ONNX outputs go to one
``.npz``; the reports name the file written), must not be one of the input files, and is
checked, like the sizes, the input files and the simulators' environment (``NPU_DRAM``,
``NPU_BACKPRESSURE``), before anything runs.

Bad input ends with a one-line ``npu: error: ...`` on stderr and exit status 2; a GEMM that is
not bit-exact (with the numpy reference: ``reference_gemm`` / ``reference_qgemm``), or a
program that stopped with an error, exits with status 1.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from hw.config import BUS_WIDTHS, NPUConfig
from .backend import SIMULATORS
from .compiler import SCHEDULES
from .errors import BackendUnavailable, LinkError, NPUError, NPURunError, NPUValueError


__all__ = ["main", "load_npy", "output_file", "save_npy", "check_gemm_shape",
           "positive_int"]


#: Exit status for bad input (as argparse uses).
EXIT_USAGE = 2
#: Exit status when the NPU ran but did not produce the exact product.
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``npu: error: ...``, and exit 2."""

    def error(self, message):
        sys.stderr.write(f"npu: error: {message}\n")
        sys.exit(EXIT_USAGE)


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {value}")
    return value


def _seed(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, not {value}")
    return value


def _int8(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not -128 <= value <= 127:
        raise argparse.ArgumentTypeError(f"must be within -128 .. 127, not {value}")
    return value


def _config_name(text):
    try:
        NPUConfig.from_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


#: The operand files of ``npu qgemm``: option name and help.
_QGEMM_FILES = [
    ("a", "int8 matrix A, M x K"),
    ("b", "int8 matrix B, K x N"),
    ("bias", "int32 vector of N biases"),
    ("multiplier", "int32 vector of N requantization multipliers"),
    ("shift", "int32 vector of N shifts, -31 .. 31 (positive: right shift)"),
]


def _build_parser():
    parser = _Parser(prog="npu", description="Weight-stationary INT8 systolic-array NPU.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_config_arguments(command):
        command.add_argument("--config", type=_config_name, default="8x8",
                             help="array size RxC (default 8x8)")
        command.add_argument("--spad-depth", type=positive_int, default=None,
                             help="scratchpad rows (default: NPUConfig's)")
        command.add_argument("--acc-depth", type=positive_int, default=None,
                             help="accumulator rows (default: NPUConfig's)")
        command.add_argument("--bus-width", type=int, choices=BUS_WIDTHS, default=None,
                             help="AXI4 data width in bits (default: 8 x rows rounded up to a "
                                  "power of two, 64 to 512)")
        add_board_arguments(command)

    def add_board_arguments(command):
        command.add_argument("--port", metavar="PORT",
                             help="with --sim board: the SoC's UART (/dev/ttyUSB0, or a "
                                  "pyserial URL such as socket://HOST:PORT) or a litex_server "
                                  "(tcp://HOST:PORT)")
        command.add_argument("--soc", metavar="soc.json",
                             help="with --sim board: the SoC's description, written beside "
                                  "its bitstream (default: the one board build of the config "
                                  "under build/board)")

    gemm = commands.add_parser("gemm", help="run C = A @ B and compare it with numpy")
    gemm.add_argument("--m", type=positive_int, help="rows of A and C (random mode)")
    gemm.add_argument("--k", type=positive_int, help="columns of A, rows of B (random mode)")
    gemm.add_argument("--n", type=positive_int, help="columns of B and C (random mode)")
    gemm.add_argument("--a", metavar="A.npy", help="int8 matrix A (instead of random)")
    gemm.add_argument("--b", metavar="B.npy", help="int8 matrix B (instead of random)")
    gemm.add_argument("--out", metavar="C.npy",
                      help="write the int32 result here (.npy is appended to a name without "
                           "it, as numpy.save does; not one of the input files)")
    add_config_arguments(gemm)
    gemm.add_argument("--sim", choices=SIMULATORS, default="verilator",
                      help="backend (default verilator)")
    gemm.add_argument("--schedule", choices=SCHEDULES, default="auto",
                      help="compiler schedule (default auto)")
    gemm.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    gemm.add_argument("--json", action="store_true", help="print one JSON object")

    plan = commands.add_parser(
        "plan", help="tile a GEMM and predict its cost, without simulating")
    plan.add_argument("--m", type=positive_int, required=True, help="rows of A and C")
    plan.add_argument("--k", type=positive_int, required=True, help="columns of A, rows of B")
    plan.add_argument("--n", type=positive_int, required=True, help="columns of B and C")
    add_config_arguments(plan)
    plan.add_argument("--rows", type=positive_int, default=None,
                      help="PE rows (with --cols, instead of --config)")
    plan.add_argument("--cols", type=positive_int, default=None,
                      help="PE columns (with --rows, instead of --config)")
    plan.add_argument("--schedule", choices=SCHEDULES, default="auto",
                      help="compiler schedule (default auto)")
    from .timing import MEMORIES
    plan.add_argument("--memory", choices=tuple(MEMORIES), default="sim",
                      help="the DRAM the cycles are predicted for: sim, the simulated DRAM "
                           "(exact), or ulx3s, the SoC's SDRAM behind LiteDRAM (within the "
                           "error docs/board.md states); default sim")
    plan.add_argument("--json", action="store_true", help="print one JSON object")

    qgemm = commands.add_parser(
        "qgemm", help="run Y = requantize((A - za) @ B + bias) in INT8 and compare it with "
                      "numpy")
    qgemm.add_argument("--m", type=positive_int, help="rows of A and Y (random mode)")
    qgemm.add_argument("--k", type=positive_int, help="columns of A, rows of B (random mode)")
    qgemm.add_argument("--n", type=positive_int, help="columns of B and Y (random mode)")
    for option, what in _QGEMM_FILES:
        qgemm.add_argument(f"--{option}", metavar=f"{option.upper()}.npy", help=what)
    qgemm.add_argument("--out-zero-point", type=_int8, metavar="Z",
                       help="zero point of Y (required with files; random mode: 0)")
    qgemm.add_argument("--act-min", type=_int8, metavar="LO",
                       help="lower clamp of Y (required with files; random mode: -128)")
    qgemm.add_argument("--act-max", type=_int8, metavar="HI",
                       help="upper clamp of Y (required with files; random mode: 127)")
    qgemm.add_argument("--a-zero-point", type=_int8, default=0, metavar="ZA",
                       help="zero point of A (default 0)")
    qgemm.add_argument("--out", metavar="Y.npy",
                       help="write the int8 result here (.npy is appended to a name without "
                            "it, as numpy.save does; not one of the input files)")
    add_config_arguments(qgemm)
    qgemm.add_argument("--sim", choices=SIMULATORS, default="verilator",
                       help="backend (default verilator)")
    qgemm.add_argument("--schedule", choices=SCHEDULES, default="auto",
                       help="compiler schedule (default auto)")
    qgemm.add_argument("--seed", type=_seed, default=0,
                       help="random seed (random mode, default 0)")
    qgemm.add_argument("--json", action="store_true", help="print one JSON object")

    verilog = commands.add_parser("verilog", help="write the Verilog of one configuration")
    add_config_arguments(verilog)
    verilog.add_argument("-o", "--output", required=True, metavar="FILE",
                         help="Verilog file to write")

    commands.add_parser("trace", help="print the seeds' 2x2 trace, simulated cycle by cycle")

    demo = commands.add_parser(
        "demo", help="train, quantize and run a small CNN on the NPU, and write its report")
    demo.add_argument("network", choices=["digits"],
                      help="digits: Conv-ReLU-Conv-BatchNorm-ReLU-GEMM on scikit-learn's "
                           "8x8 digits")
    add_config_arguments(demo)
    demo.add_argument("--sim", choices=SIMULATORS, default="verilator",
                      help="backend (default verilator)")
    demo.add_argument("--batch", type=positive_int, default=64,
                      help="test images per NPU program (default 64)")
    demo.add_argument("--out", default="docs/demo.md", metavar="FILE",
                      help="report to write (default docs/demo.md)")
    demo.add_argument("--json", action="store_true", help="print the figures as JSON")

    board = commands.add_parser("board", help="the NPU on a board's LiteX SoC")
    board_commands = board.add_subparsers(dest="board_command", required=True,
                                          parser_class=_Parser)
    probe = board_commands.add_parser("probe", help="read the NPU's identity and config "
                                                     "through the link")
    add_board_arguments(probe)
    probe.add_argument("--json", action="store_true", help="print one JSON object")

    from .onnx.command import add_parser as add_onnx_parser
    add_onnx_parser(commands, add_config_arguments)
    from .stack import add_parser as add_stack_parser
    add_stack_parser(commands)

    bench = commands.add_parser(
        "bench", help="the utilization sweep from the hardware counters and the simulator "
                      "speeds (about 7 minutes), written to a report")
    bench.add_argument("--quick", action="store_true", help="a small sweep, for a check")
    bench.add_argument("--out", default="docs/performance.md", metavar="FILE",
                       help="report to write (default docs/performance.md); the plot "
                            "utilization.png goes next to it")
    bench.add_argument("--no-speed", action="store_true", help="skip the simulator speeds")
    return parser


def _config_from(arguments):
    depths = {}
    if arguments.spad_depth is not None:
        depths["spad_depth"] = arguments.spad_depth
    if arguments.acc_depth is not None:
        depths["acc_depth"] = arguments.acc_depth
    if getattr(arguments, "bus_width", None) is not None:
        depths["bus_width"] = arguments.bus_width
    name = arguments.config
    rows, cols = getattr(arguments, "rows", None), getattr(arguments, "cols", None)
    if (rows is None) != (cols is None):
        raise NPUValueError("--rows and --cols must be given together")
    if rows is not None:
        name = f"{rows}x{cols}"
    try:
        return NPUConfig.from_name(name, **depths)
    except ValueError as error:
        raise NPUValueError(f"bad configuration: {error}") from None


#: Every .npy file starts with these bytes (NumPy's format specification).
NPY_MAGIC = b"\x93NUMPY"


def load_npy(option, path):
    """The array in the ``.npy`` file ``path``, given as ``option`` (for messages).

    The header is read first and the size it claims checked against the file's length, so a
    damaged or hand-made header (a huge shape over a few bytes of data) is refused with one
    line instead of a ``MemoryError`` or a short read; NumPy's own reader then loads the
    array, without pickles.

    Raises
    ------
    NPUValueError
        If the file is missing, unreadable, not a ``.npy`` file, or shorter than its header
        says.
    """
    try:
        with open(path, "rb") as file:
            magic = file.read(len(NPY_MAGIC))
            if magic != NPY_MAGIC:
                # np.load would try other formats and blame pickling; say what is wrong.
                raise NPUValueError(f"{option} {path}: not a .npy file (it does not start "
                                    f"with the NumPy magic string); save the array with "
                                    f"numpy.save")
            file.seek(0)
            shape, dtype, data_bytes = _npy_header(option, path, file)
    except FileNotFoundError:
        raise NPUValueError(f"{option} {path}: no such file") from None
    except OSError as error:
        raise NPUValueError(f"{option} {path}: cannot be read ({error.strerror})") from None
    if dtype.hasobject:
        raise NPUValueError(f"{option} {path}: not a valid .npy file here (it holds pickled "
                            f"Python objects, {dtype}, which are not loaded)")
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > data_bytes:
        shown = "x".join(map(str, shape)) or "a scalar"
        raise NPUValueError(f"{option} {path}: not a valid .npy file: its header claims "
                            f"{shown} {dtype} ({claimed:,} bytes), but the file holds "
                            f"{data_bytes:,} bytes of data (truncated or damaged)")
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise NPUValueError(f"{option} {path}: not a valid .npy file ({error})") from None
    return array


def _npy_header(option, path, file):
    """``(shape, dtype, bytes of data after the header)`` of the open ``.npy`` ``file``."""
    from numpy.lib import format as npy_format
    try:
        version = npy_format.read_magic(file)
        # Versions 2.0 and 3.0 differ from 1.0 only in the header's length field (3.0 also
        # in its text encoding, which does not matter for the fields read here).
        read = npy_format.read_array_header_1_0 if version == (1, 0) \
            else npy_format.read_array_header_2_0
        shape, _, dtype = read(file)
    except Exception as error:      # numpy's parser of the header's text raises many kinds
        raise NPUValueError(f"{option} {path}: not a valid .npy file (bad header: "
                            f"{type(error).__name__}: {error})") from None
    return shape, dtype, os.fstat(file.fileno()).st_size - file.tell()


def output_file(option, path, suffix, inputs, what="the result is one array"):
    """The file ``--out path`` will write, after checking it before anything runs.

    The rule, as numpy's own writers have it: a name that ends in ``suffix`` (``.npy`` for
    one array, ``.npz`` for an archive of several) is written as given, any other name gets
    ``suffix`` appended (``C`` writes ``C.npy``, as ``numpy.save`` does), except a name ending
    in the other of the two suffixes, which would name a file of the wrong kind and is
    refused. The reports name the file actually written.

    Parameters
    ----------
    option : str
        The option's name, for messages.
    path : str
        What the user gave.
    suffix : str
        ``".npy"`` or ``".npz"``.
    inputs : dict
        ``{option: path}`` of the command's input files (None: not given); the output must be
        none of them.
    what : str
        What is written, as a clause for messages (``"the model has 2 outputs (a, b)"``).

    Returns
    -------
    str
        The path to write.

    Raises
    ------
    NPUValueError
        For a name of the wrong kind, a missing or unwritable directory, a directory given as
        the file, or a file that is one of the inputs.
    """
    other = {".npy": ".npz", ".npz": ".npy"}[suffix]
    if path.lower().endswith(other):
        raise NPUValueError(f"{option} {path}: {what}, written to a {suffix} file; give a "
                            f"name ending in {suffix}")
    target = path if path.lower().endswith(suffix) else path + suffix
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise NPUValueError(f"{option} {path}: no such directory {os.path.dirname(target)}")
    if os.path.isdir(target):
        raise NPUValueError(f"{option} {path}: is a directory; give a file name")
    if not os.access(folder, os.W_OK):
        raise NPUValueError(f"{option} {path}: cannot write into {folder} (permission "
                            f"denied)")
    for name, source in inputs.items():
        if source is not None and os.path.exists(target) and os.path.exists(source) \
                and os.path.samefile(target, source):
            raise NPUValueError(f"{option} {path}: is the input file {name} {source}; give "
                                f"another file")
    return target


def save_npy(option, target, array):
    """Write ``array`` to the checked path ``target`` (:func:`output_file`): to exactly that
    file (numpy.save, given a name, would append ``.npy`` to ``C.NPY``)."""
    try:
        with open(target, "wb") as file:
            np.save(file, array, allow_pickle=False)
    except OSError as error:
        raise NPUValueError(f"{option} {target}: cannot write ({error.strerror})") from None


def check_gemm_shape(m, k, n, *, quantized=False):
    """Refuse a GEMM shape that ``npu gemm`` (or ``qgemm``) refuses, before anything is
    allocated or planned: ``npu plan`` and the random modes call it with the sizes given.

    The checks are the driver's own: :func:`sw.operands.check_gemm_operands` (K at most
    :data:`hw.config.MAX_K`) on zero-stride stand-ins for A and B, which take no memory, and
    the DRAM layout of the operands with an empty program
    (:func:`sw.driver.layout_dram`, or :func:`sw.driver.layout_regions` for the quantized
    GEMM's INT8 output), which must fit in the 4 GiB a 32-bit address reaches.

    Raises
    ------
    NPUValueError
        With the message ``npu gemm`` gives for the same shape.
    """
    from .driver import layout_dram, layout_regions
    from .operands import check_gemm_operands
    zero = np.int8(0)
    check_gemm_operands(np.broadcast_to(zero, (m, k)), np.broadcast_to(zero, (k, n)))
    if quantized:
        # A lower bound of sw.driver.prepare_qgemm's layout: its bias and quantization
        # parameters (12 bytes per column) are left out.
        layout_regions(0, [("a", m * k), ("b", k * n), ("y", m * n)],
                       what=f"a {m}x{k} @ {k}x{n} quantized GEMM")
    else:
        layout_dram(m, k, n, instructions=0)


def _operands(arguments):
    """A, B and the seed (None for user matrices) from the gemm arguments."""
    shape_given = [arguments.m, arguments.k, arguments.n]
    if arguments.a is not None or arguments.b is not None:
        if arguments.a is None or arguments.b is None:
            raise NPUValueError("--a and --b must be given together")
        if any(value is not None for value in shape_given):
            raise NPUValueError("--m, --k and --n cannot be combined with --a and --b "
                                "(the shape comes from the matrices)")
        return load_npy("--a", arguments.a), load_npy("--b", arguments.b), None
    if any(value is None for value in shape_given):
        raise NPUValueError("--m, --k and --n are required unless --a and --b are given")
    check_gemm_shape(*shape_given)
    rng = np.random.default_rng(arguments.seed)
    # endpoint=True: the full INT8 range, -128 and 127 included.
    a = rng.integers(-128, 127, size=(arguments.m, arguments.k), dtype=np.int8, endpoint=True)
    b = rng.integers(-128, 127, size=(arguments.k, arguments.n), dtype=np.int8, endpoint=True)
    return a, b, arguments.seed


def _run_gemm(arguments):
    from dataclasses import replace
    from .driver import gemm
    from .reference import reference_gemm
    from .timing import predict_gemm

    config = _config_from(arguments)
    out = None if arguments.out is None else output_file(
        "--out", arguments.out, ".npy", {"--a": arguments.a, "--b": arguments.b})
    a, b, seed = _operands(arguments)
    started = time.perf_counter()
    result = gemm(a, b, config=config, sim=arguments.sim, schedule=arguments.schedule)
    m, k = a.shape
    n = b.shape[1]
    predicted = arguments.sim == "model"
    if predicted:
        # The model has no clock; the cycle model gives the RTL's cycles and counters exactly.
        timing = predict_gemm(config, m, k, n, schedule=arguments.schedule)
        result = replace(result, cycles=timing.cycles, perf=timing.perf)
    expected = reference_gemm(a, b)
    mismatches = int(np.count_nonzero(result.c != expected))
    bit_exact = mismatches == 0
    wall = time.perf_counter() - started
    if out is not None:
        save_npy("--out", out, result.c)

    plan = result.plan
    report = {
        "m": m, "k": k, "n": n, "rows": config.rows, "cols": config.cols,
        "config": config.name, "spad_depth": config.spad_depth,
        "acc_depth": config.acc_depth, "sim": arguments.sim, "bit_exact": bit_exact,
        "mismatches": mismatches, "cycles": result.cycles, "cycles_predicted": predicted,
        "macs": result.macs,
        "utilization": result.utilization, "weight_tiles": plan.weight_tiles,
        "k_tiles": plan.k_tiles, "n_tiles": plan.n_tiles, "m_blocks": plan.m_blocks,
        "block_rows": plan.block_rows, "schedule": plan.schedule,
        "tile_fill": plan.tile_fill, "dram_bytes_read": plan.dram_bytes_read,
        "dram_bytes_written": plan.dram_bytes_written, "seed": seed,
        "instructions": result.instructions, "out": out,
        "bus_width": config.bus_width, "mapping_efficiency": plan.mapping_efficiency,
        "group_tiles": plan.group_tiles, "counters": result.perf, "wall_seconds": wall,
        "link": result.link,
    }
    if arguments.json:
        print(json.dumps(report))
    else:
        source = f"seed {seed}" if seed is not None else f"{arguments.a}, {arguments.b}"
        marker = " (predicted by the cycle model)" if predicted else ""
        print(f"gemm {m}x{k} @ {k}x{n} -> {m}x{n} int32 ({source})\n"
              f"config {config.name} (scratchpad {config.spad_depth} rows, accumulator "
              f"{config.acc_depth} rows), sim {arguments.sim}\n"
              f"bit-exact: {'yes' if bit_exact else f'NO, {mismatches} elements differ'}\n"
              f"cycles: {result.cycles}{marker}\n"
              f"utilization: {result.utilization:.1%} of {config.rows * config.cols} PEs "
              f"({result.macs} MACs){', predicted' if predicted else ''}\n"
              f"instructions executed: {result.instructions}\n"
              f"{plan.summary()}")
        if result.link is not None:
            print(_link_line(result.link))
        if not predicted:
            print(f"wall time: {wall:.1f} s to compile, simulate and check, "
                  f"{result.cycles / wall:,.0f} simulated cycles/s")
    if not bit_exact:
        print(f"npu: error: the result differs from numpy in {mismatches} of {m * n} "
              f"elements", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _qgemm_operands(arguments):
    """The qgemm operands (a dict for :func:`sw.driver.qgemm`) and the seed (None for files)."""
    from .quant import quantize_multiplier

    files = {option: getattr(arguments, option) for option, _ in _QGEMM_FILES}
    shape_given = [arguments.m, arguments.k, arguments.n]
    requantization = {"out_zero_point": arguments.out_zero_point,
                      "act_min": arguments.act_min, "act_max": arguments.act_max}
    if any(path is not None for path in files.values()):
        missing = [f"--{option}" for option, path in files.items() if path is None]
        if missing:
            raise NPUValueError(f"{', '.join(missing)} must be given too: the operand files "
                                f"--a, --b, --bias, --multiplier and --shift go together")
        if any(value is not None for value in shape_given):
            raise NPUValueError("--m, --k and --n cannot be combined with operand files "
                                "(the shape comes from the matrices)")
        missing = [f"--{name.replace('_', '-')}" for name, value in requantization.items()
                   if value is None]
        if missing:
            raise NPUValueError(f"{', '.join(missing)} required with operand files")
        operands = {option if option not in ("a", "b") else option.upper():
                    load_npy(f"--{option}", path) for option, path in files.items()}
        return dict(operands, a_zero_point=arguments.a_zero_point, **requantization), None
    if any(value is None for value in shape_given):
        raise NPUValueError("--m, --k and --n are required unless the operand files --a, --b, "
                            "--bias, --multiplier and --shift are given")
    m, k, n = shape_given
    check_gemm_shape(m, k, n, quantized=True)
    rng = np.random.default_rng(arguments.seed)
    a = rng.integers(-128, 127, size=(m, k), dtype=np.int8, endpoint=True)
    b = rng.integers(-128, 127, size=(k, n), dtype=np.int8, endpoint=True)
    # A k-long dot product of uniform INT8 values spreads by about 74 * 74 * sqrt(k): scale
    # it to a spread of about 40 so that Y uses the INT8 range.
    spread = int(74 * 74 * np.sqrt(k))
    bias = rng.integers(-spread, spread, size=n, endpoint=True).astype(np.int32)
    pairs = [quantize_multiplier(40.0 / spread * scale)
             for scale in rng.uniform(0.5, 2.0, size=n)]
    defaults = {"out_zero_point": 0, "act_min": -128, "act_max": 127}
    requantization = {name: defaults[name] if value is None else value
                      for name, value in requantization.items()}
    return dict(A=a, B=b, bias=bias,
                multiplier=np.array([pair[0] for pair in pairs], dtype=np.int32),
                shift=np.array([pair[1] for pair in pairs], dtype=np.int32),
                a_zero_point=arguments.a_zero_point, **requantization), arguments.seed


def _run_qgemm(arguments):
    from .driver import qgemm
    from .reference import reference_qgemm

    config = _config_from(arguments)
    out = None if arguments.out is None else output_file(
        "--out", arguments.out, ".npy",
        {f"--{option}": getattr(arguments, option) for option, _ in _QGEMM_FILES})
    operands, seed = _qgemm_operands(arguments)
    result = qgemm(**operands, config=config, sim=arguments.sim, schedule=arguments.schedule)
    expected = reference_qgemm(**operands)
    mismatches = int(np.count_nonzero(result.y != expected))
    bit_exact = mismatches == 0
    if out is not None:
        save_npy("--out", out, result.y)

    plan = result.plan
    m, k = operands["A"].shape
    n = operands["B"].shape[1]
    report = {
        "m": m, "k": k, "n": n, "rows": config.rows, "cols": config.cols,
        "config": config.name, "spad_depth": config.spad_depth,
        "acc_depth": config.acc_depth, "sim": arguments.sim, "bit_exact": bit_exact,
        "mismatches": mismatches, "cycles": result.cycles, "macs": result.macs,
        "utilization": result.utilization, "weight_tiles": plan.weight_tiles,
        "k_tiles": plan.k_tiles, "n_tiles": plan.n_tiles, "m_blocks": plan.m_blocks,
        "block_rows": plan.block_rows, "schedule": plan.schedule,
        "tile_fill": plan.tile_fill, "dram_bytes_read": plan.dram_bytes_read,
        "dram_bytes_written": plan.dram_bytes_written, "seed": seed,
        "instructions": result.instructions, "out": out,
        "a_zero_point": operands["a_zero_point"],
        "out_zero_point": operands["out_zero_point"], "act_min": operands["act_min"],
        "act_max": operands["act_max"], "link": result.link,
    }
    if arguments.json:
        print(json.dumps(report))
    else:
        source = f"seed {seed}" if seed is not None else f"{arguments.a}, {arguments.b}"
        cycles = "n/a (the model counts no cycles)" if result.cycles is None \
            else str(result.cycles)
        utilization = "n/a" if result.utilization is None else f"{result.utilization:.1%}"
        print(f"qgemm {m}x{k} @ {k}x{n} -> {m}x{n} int8 ({source})\n"
              f"zero points A {operands['a_zero_point']}, Y {operands['out_zero_point']}; "
              f"clamp {operands['act_min']} .. {operands['act_max']}\n"
              f"config {config.name} (scratchpad {config.spad_depth} rows, accumulator "
              f"{config.acc_depth} rows), sim {arguments.sim}\n"
              f"bit-exact: {'yes' if bit_exact else f'NO, {mismatches} elements differ'}\n"
              f"cycles: {cycles}\n"
              f"utilization: {utilization} of {config.rows * config.cols} PEs "
              f"({result.macs} MACs)\n"
              f"instructions executed: {result.instructions}\n"
              f"{plan.summary()}")
    if not bit_exact:
        print(f"npu: error: the result differs from numpy in {mismatches} of {m * n} "
              f"elements", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _run_verilog(arguments):
    config = _config_from(arguments)
    try:
        from hw.top import generate_verilog
    except ModuleNotFoundError as error:
        if error.name != "hw.top":
            raise
        raise BackendUnavailable("Verilog generation is not available: hw.top is not "
                                 "installed") from None
    verilog = generate_verilog(config)
    try:
        with open(arguments.output, "w") as file:
            file.write(verilog)
    except OSError as error:
        raise NPUValueError(f"-o {arguments.output}: cannot write ({error})") from None
    return 0


def _run_trace(arguments):
    try:
        from sim.trace import format_trace
    except ModuleNotFoundError as error:
        if error.name not in ("sim", "sim.trace"):
            raise
        raise BackendUnavailable("tracing is not available: sim.trace is not "
                                 "installed") from None
    print(format_trace())
    return 0


def _run_demo(arguments):
    from .nn.demo import DemoMismatch, run_demo
    try:
        report = run_demo(sim=arguments.sim, batch=arguments.batch, out=arguments.out,
                          config=_config_from(arguments))
    except DemoMismatch as error:
        _report(error)            # the report was written; the NPU disagreed with it
        return EXIT_FAILURE
    if arguments.json:
        print(json.dumps(report))
    else:
        print(f"digits on {arguments.config} ({arguments.sim}): report written to "
              f"{arguments.out}")
        for key in ("float_accuracy", "int8_accuracy", "npu_accuracy", "bit_exact"):
            if key in report:
                print(f"  {key}: {report[key]}")
    return 0 if report.get("bit_exact", False) else EXIT_FAILURE


def _run_bench(arguments):
    from pathlib import Path
    from .bench import BenchMismatch, run
    try:
        run(Path(arguments.out), quick=arguments.quick, speed=not arguments.no_speed)
    except BenchMismatch as error:
        _report(error)
        return EXIT_FAILURE
    return 0


def _run_board(arguments):
    from .board import BoardLink, BoardNPU
    if not arguments.port:
        raise NPUValueError("npu board probe needs --port (/dev/ttyUSB0, socket://HOST:PORT "
                            "or tcp://HOST:PORT)")
    with BoardLink(arguments.port) as link:
        found = BoardNPU(link).probe()
    config = found.pop("config")
    report = {**found, "config": config.name, "spad_depth": config.spad_depth,
              "acc_depth": config.acc_depth, "bus_width": config.bus_width}
    if arguments.json:
        print(json.dumps(report))
    else:
        print(f"NPU at {found['npu_base']:#010x} through {found['url']}: version "
              f"{found['version'] >> 16}.{found['version'] & 0xFFFF}, config {config.name} "
              f"(scratchpad {config.spad_depth} rows, accumulator {config.acc_depth} rows, "
              f"{config.bus_width}-bit bus); SDRAM {found['dram_size'] >> 20} MiB at "
              f"{found['dram_base']:#010x}")
    return 0


def _link_line(link):
    """The host link's figures of a run on the SoC, one line."""
    return (f"host link: {link['tx_bytes']:,} bytes sent, {link['rx_bytes']:,} received in "
            f"{link['seconds']:.1f} s ({link['seconds_at_3mbaud']:.2f} s at 3 Mbaud)")


def _run_onnx(arguments):
    from .onnx.command import run
    return run(arguments, _config_from(arguments))


def _run_stack(arguments):
    from .stack import run
    return run(arguments, _config_from(arguments))


def _run_plan(arguments):
    from .compiler import plan_gemm, scalesim_cycles
    from .timing import memory_for, predict_gemm

    config = _config_from(arguments)
    check_gemm_shape(arguments.m, arguments.k, arguments.n)
    plan = plan_gemm(config, arguments.m, arguments.k, arguments.n,
                     schedule=arguments.schedule)
    pes = config.rows * config.cols
    memory = memory_for(arguments.memory, config)
    timing = predict_gemm(config, plan.m, plan.k, plan.n, schedule=arguments.schedule,
                          memory=memory)
    predicted = timing.cycles
    scalesim = scalesim_cycles(config, plan.m, plan.k, plan.n)
    report = {
        "m": plan.m, "k": plan.k, "n": plan.n, "rows": config.rows, "cols": config.cols,
        "config": config.name, "bus_width": config.bus_width,
        "spad_depth": config.spad_depth, "acc_depth": config.acc_depth,
        "schedule": plan.schedule, "weight_tiles": plan.weight_tiles,
        "k_tiles": plan.k_tiles, "n_tiles": plan.n_tiles,
        "mapping_efficiency": plan.mapping_efficiency,
        "useful_pe_cells": plan.k * plan.n,
        "provisioned_pe_cells": plan.weight_tiles * pes,
        "memory": memory.name, "read_latency": memory.read_latency,
        "write_response_latency": memory.write_response_latency,
        "read_beat_cycles": memory.read_beat_cycles,
        "write_beat_cycles": memory.write_beat_cycles,
        "predicted_cycles": predicted,
        "predicted_utilization": plan.macs / (predicted * pes),
        "predicted_counters": timing.perf,
        "scalesim_cycles": scalesim,
        "scalesim_utilization": plan.macs / (scalesim * pes),
        "m_blocks": plan.m_blocks, "block_rows": plan.block_rows,
        "group_tiles": plan.group_tiles, "instructions": plan.instructions,
        "spad_rows_used": plan.spad_rows_used,
        "spad_bytes_used": plan.spad_rows_used * config.spad_row_bytes,
        "acc_rows_used": plan.acc_rows_used,
        "acc_bytes_used": plan.acc_rows_used * config.acc_row_bytes,
        "dram_bytes_read": plan.dram_bytes_read + plan.program_bytes,
        "dram_bytes_written": plan.dram_bytes_written,
        "program_bytes": plan.program_bytes,
    }
    if arguments.json:
        print(json.dumps(report))
        return 0
    print(f"gemm {plan.m}x{plan.k} @ {plan.k}x{plan.n} on {config.name} "
          f"({config.bus_width}-bit bus), {plan.schedule} schedule")
    print(f"weight tiles: {plan.weight_tiles} ({plan.k_tiles} x {plan.n_tiles})")
    print(f"mapping efficiency: {plan.k * plan.n:,} / {plan.weight_tiles * pes:,} = "
          f"{plan.mapping_efficiency:.1%}")
    print(f"predicted cycles: {predicted:,} (cycle model, sw/timing.py), utilization "
          f"{report['predicted_utilization']:.1%}")
    print(f"memory: {memory.name} (read latency {memory.read_latency}, write response "
          f"{memory.write_response_latency}, a read beat every {memory.read_beat_cycles} "
          f"cycles, a write beat every {memory.write_beat_cycles})")
    print(f"SCALE-Sim weight-stationary model: {scalesim:,} cycles, utilization "
          f"{report['scalesim_utilization']:.1%}")
    print(f"scratchpad: {plan.spad_rows_used} rows ({report['spad_bytes_used']:,} bytes), "
          f"accumulator: {plan.acc_rows_used} rows ({report['acc_bytes_used']:,} bytes)")
    print(f"DRAM traffic: {report['dram_bytes_read']:,} bytes read (program included), "
          f"{plan.dram_bytes_written:,} written")
    return 0


def main(argv=None):
    """Run the ``npu`` command line.

    Parameters
    ----------
    argv : list of str, optional
        The arguments (without the program name); ``sys.argv[1:]`` by default.

    Returns
    -------
    int
        The exit status: 0 on success, 1 when the NPU ran but failed (not bit-exact, a
        program error, a missing backend), 2 on bad input.
    """
    try:
        arguments = _build_parser().parse_args(argv)
    except SystemExit as exit:
        # argparse exits after --help or a usage error; return its status for in-process use.
        return exit.code
    handlers = {"gemm": _run_gemm, "plan": _run_plan, "qgemm": _run_qgemm, "verilog": _run_verilog,
                "trace": _run_trace, "demo": _run_demo, "bench": _run_bench,
                "onnx": _run_onnx, "board": _run_board, "stack": _run_stack}
    _board_environment(arguments)
    try:
        _check_environment()
        return handlers[arguments.command](arguments)
    except (NPURunError, BackendUnavailable, LinkError) as error:
        _report(error)
        return EXIT_FAILURE
    except NPUError as error:
        _report(error)
        return EXIT_USAGE
    except MemoryError:
        # The sizes are checked against the NPU's limits first; this is the machine's.
        _report(f"not enough memory on this machine for npu {arguments.command} with these "
                f"sizes")
        return EXIT_USAGE


#: The environment variables of the RTL simulations (:mod:`sim.bench_top`), checked when the
#: command starts.
SIM_ENVIRONMENT = ("NPU_DRAM", "NPU_BACKPRESSURE")


def _check_environment():
    """Refuse a bad ``NPU_DRAM`` or ``NPU_BACKPRESSURE`` before anything runs, with the
    simulation's own readers (:func:`sim.bench_top.dram_from_env`,
    :func:`sim.bench_top.backpressure_from_env`), instead of a traceback from deep inside a
    simulation, or a failed simulation, minutes later.

    The simulation package is imported only when one of the variables is set, so commands
    that simulate nothing start no slower; without it nothing reads them."""
    if not any(os.environ.get(name, "").strip() for name in SIM_ENVIRONMENT):
        return
    try:
        from sim.bench_top import backpressure_from_env, dram_from_env
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] not in ("sim", "hw", "amaranth"):
            raise
        return
    for read in (dram_from_env, backpressure_from_env):
        try:
            read()
        except ValueError as error:
            raise NPUValueError(str(error)) from None


def _board_environment(arguments):
    """``--port`` and ``--soc`` reach the board backend (:mod:`sw.board`) through its
    environment variables, as the simulators' settings do."""
    from .board import BOARD_ENV, SOC_ENV
    import os
    if getattr(arguments, "port", None):
        os.environ[BOARD_ENV] = arguments.port
    if getattr(arguments, "soc", None):
        os.environ[SOC_ENV] = arguments.soc


def _report(error):
    # One line, whatever the message: the error may quote text from a file.
    message = " ".join(str(error).splitlines())
    print(f"npu: error: {message}", file=sys.stderr)
