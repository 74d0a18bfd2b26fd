"""The ``npu`` command line: run GEMMs, write the Verilog, print a trace.

::

    npu gemm --m 64 --k 100 --n 100 --config 8x8 --sim model --seed 1 [--json]
    npu gemm --a A.npy --b B.npy [--out C.npy] --sim model
    npu verilog --config 8x8 -o npu_8x8.v
    npu trace

Bad input ends with a one-line ``npu: error: ...`` on stderr and exit status 2; a GEMM that is
not bit-exact, or a program that stopped with an error, exits with status 1.
"""

import argparse
import json
import sys

import numpy as np

from hw.config import NPUConfig
from .backend import SIMULATORS
from .compiler import SCHEDULES
from .errors import BackendUnavailable, NPUError, NPURunError, NPUValueError


__all__ = ["main"]


#: Exit status for bad input (as argparse uses).
EXIT_USAGE = 2
#: Exit status when the NPU ran but did not produce the exact product.
EXIT_FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``npu: error: ...``, and exit 2."""

    def error(self, message):
        sys.stderr.write(f"npu: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _positive_int(text):
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


def _config_name(text):
    try:
        NPUConfig.from_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _build_parser():
    parser = _Parser(prog="npu", description="Weight-stationary INT8 systolic-array NPU.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_config_arguments(command):
        command.add_argument("--config", type=_config_name, default="8x8",
                             help="array size RxC (default 8x8)")
        command.add_argument("--spad-depth", type=_positive_int, default=None,
                             help="scratchpad rows (default: NPUConfig's)")
        command.add_argument("--acc-depth", type=_positive_int, default=None,
                             help="accumulator rows (default: NPUConfig's)")

    gemm = commands.add_parser("gemm", help="run C = A @ B and compare it with numpy")
    gemm.add_argument("--m", type=_positive_int, help="rows of A and C (random mode)")
    gemm.add_argument("--k", type=_positive_int, help="columns of A, rows of B (random mode)")
    gemm.add_argument("--n", type=_positive_int, help="columns of B and C (random mode)")
    gemm.add_argument("--a", metavar="A.npy", help="int8 matrix A (instead of random)")
    gemm.add_argument("--b", metavar="B.npy", help="int8 matrix B (instead of random)")
    gemm.add_argument("--out", metavar="C.npy", help="write the int32 result here")
    add_config_arguments(gemm)
    gemm.add_argument("--sim", choices=SIMULATORS, default="verilator",
                      help="backend (default verilator)")
    gemm.add_argument("--schedule", choices=SCHEDULES, default="auto",
                      help="compiler schedule (default auto)")
    gemm.add_argument("--seed", type=_seed, default=0, help="random seed (default 0)")
    gemm.add_argument("--json", action="store_true", help="print one JSON object")

    verilog = commands.add_parser("verilog", help="write the Verilog of one configuration")
    add_config_arguments(verilog)
    verilog.add_argument("-o", "--output", required=True, metavar="FILE",
                         help="Verilog file to write")

    commands.add_parser("trace", help="print a cycle trace of a small GEMM")
    return parser


def _config_from(arguments):
    depths = {}
    if arguments.spad_depth is not None:
        depths["spad_depth"] = arguments.spad_depth
    if arguments.acc_depth is not None:
        depths["acc_depth"] = arguments.acc_depth
    try:
        return NPUConfig.from_name(arguments.config, **depths)
    except ValueError as error:
        raise NPUValueError(f"bad configuration: {error}") from None


#: Every .npy file starts with these bytes (NumPy's format specification).
NPY_MAGIC = b"\x93NUMPY"


def _load_matrix(option, path):
    try:
        with open(path, "rb") as file:
            magic = file.read(len(NPY_MAGIC))
    except FileNotFoundError:
        raise NPUValueError(f"{option} {path}: no such file") from None
    except OSError as error:
        raise NPUValueError(f"{option} {path}: cannot be read ({error.strerror})") from None
    if magic != NPY_MAGIC:
        # np.load would try other formats and blame pickling; say what is wrong instead.
        raise NPUValueError(f"{option} {path}: not a .npy file (it does not start with the "
                            f"NumPy magic string); save the matrix with numpy.save")
    try:
        matrix = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise NPUValueError(f"{option} {path}: not a valid .npy file ({error})") from None
    if not isinstance(matrix, np.ndarray):
        # np.load returns an NpzFile for .npz archives.
        if hasattr(matrix, "close"):
            matrix.close()
        raise NPUValueError(f"{option} {path}: not a .npy file holding one array")
    return matrix


def _operands(arguments):
    """A, B and the seed (None for user matrices) from the gemm arguments."""
    shape_given = [arguments.m, arguments.k, arguments.n]
    if arguments.a is not None or arguments.b is not None:
        if arguments.a is None or arguments.b is None:
            raise NPUValueError("--a and --b must be given together")
        if any(value is not None for value in shape_given):
            raise NPUValueError("--m, --k and --n cannot be combined with --a and --b "
                                "(the shape comes from the matrices)")
        return _load_matrix("--a", arguments.a), _load_matrix("--b", arguments.b), None
    if any(value is None for value in shape_given):
        raise NPUValueError("--m, --k and --n are required unless --a and --b are given")
    rng = np.random.default_rng(arguments.seed)
    # endpoint=True: the full INT8 range, -128 and 127 included.
    a = rng.integers(-128, 127, size=(arguments.m, arguments.k), dtype=np.int8, endpoint=True)
    b = rng.integers(-128, 127, size=(arguments.k, arguments.n), dtype=np.int8, endpoint=True)
    return a, b, arguments.seed


def _run_gemm(arguments):
    from .driver import gemm, reference_gemm

    config = _config_from(arguments)
    a, b, seed = _operands(arguments)
    result = gemm(a, b, config=config, sim=arguments.sim, schedule=arguments.schedule)
    expected = reference_gemm(a, b)
    mismatches = int(np.count_nonzero(result.c != expected))
    bit_exact = mismatches == 0
    if arguments.out is not None:
        try:
            np.save(arguments.out, result.c, allow_pickle=False)
        except OSError as error:
            raise NPUValueError(f"--out {arguments.out}: cannot write ({error})") from None

    plan = result.plan
    m, k = a.shape
    n = b.shape[1]
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
        "instructions": result.instructions, "out": arguments.out,
    }
    if arguments.json:
        print(json.dumps(report))
    else:
        source = f"seed {seed}" if seed is not None else f"{arguments.a}, {arguments.b}"
        cycles = "n/a (the model counts no cycles)" if result.cycles is None \
            else str(result.cycles)
        utilization = "n/a" if result.utilization is None else f"{result.utilization:.1%}"
        print(f"gemm {m}x{k} @ {k}x{n} -> {m}x{n} int32 ({source})\n"
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
    handlers = {"gemm": _run_gemm, "verilog": _run_verilog, "trace": _run_trace}
    try:
        return handlers[arguments.command](arguments)
    except (NPURunError, BackendUnavailable) as error:
        _report(error)
        return EXIT_FAILURE
    except NPUError as error:
        _report(error)
        return EXIT_USAGE


def _report(error):
    # One line, whatever the message: the error may quote text from a file.
    message = " ".join(str(error).splitlines())
    print(f"npu: error: {message}", file=sys.stderr)
