"""The ``npu`` command line, run in-process on the model backend."""

import json
import sys
import types

import numpy as np
import pytest

from hw.config import MAX_K, NPUConfig
from hw.isa import PERF_COUNTERS
from sim.result import RunResult
from sw import backend
from sw.cli import main
from sw.driver import reference_gemm
from sw.timing import predict_gemm


def one_at_a_time(run_program):
    """A stand-in for ``backend.run_programs`` built from a one-program function."""
    return lambda config, sim, programs: [run_program(config, sim, *program)
                                          for program in programs]


JSON_KEYS = {"m", "k", "n", "rows", "cols", "sim", "bit_exact", "cycles", "macs",
             "utilization", "weight_tiles", "seed", "instructions"}


def run_cli(capsys, *argv):
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_line_error(status, out, err, expected_status=2, match=None):
    assert status == expected_status
    assert out == ""
    assert err.startswith("npu: error: ") and err.endswith("\n")
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    if match is not None:
        assert match in err, err


# gemm -----------------------------------------------------------------------------------------

def test_gemm_json(capsys):
    status, out, err = run_cli(capsys, "gemm", "--m", "13", "--k", "29", "--n", "7",
                               "--config", "3x5", "--sim", "model", "--seed", "4", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert JSON_KEYS | {"cycles_predicted", "counters"} <= set(report)
    assert (report["m"], report["k"], report["n"]) == (13, 29, 7)
    assert (report["rows"], report["cols"]) == (3, 5)
    assert report["sim"] == "model" and report["seed"] == 4
    assert report["bit_exact"] is True
    assert report["macs"] == 13 * 29 * 7
    timing = predict_gemm(NPUConfig.from_name("3x5"), 13, 29, 7)
    assert report["cycles"] == timing.cycles and report["cycles_predicted"] is True
    assert report["counters"] == timing.perf
    assert report["utilization"] == 13 * 29 * 7 / (timing.cycles * 15)
    assert report["weight_tiles"] == 10 * 2
    assert report["instructions"] > 0
    assert out.count("\n") == 1          # exactly one JSON object


def test_gemm_is_reproducible_from_seed(tmp_path, capsys):
    results = []
    for run_index, seed in enumerate(("1", "1", "2")):
        out_path = tmp_path / f"c{run_index}.npy"
        status, _, err = run_cli(capsys, "gemm", "--m", "5", "--k", "5", "--n", "5",
                                 "--sim", "model", "--seed", seed, "--out", str(out_path))
        assert status == 0, err
        results.append(np.load(out_path))
    assert np.array_equal(results[0], results[1])
    assert not np.array_equal(results[0], results[2])


def test_gemm_random_values_cover_int8_range(tmp_path, capsys):
    out_path = tmp_path / "c.npy"
    status, _, err = run_cli(capsys, "gemm", "--m", "64", "--k", "64", "--n", "1",
                             "--sim", "model", "--seed", "0", "--out", str(out_path))
    assert status == 0, err
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 127, size=(64, 64), dtype=np.int8, endpoint=True)
    b = rng.integers(-128, 127, size=(64, 1), dtype=np.int8, endpoint=True)
    assert a.min() == -128 and a.max() == 127
    assert np.array_equal(np.load(out_path), reference_gemm(a, b))


def test_gemm_readable_summary(capsys):
    status, out, err = run_cli(capsys, "gemm", "--m", "20", "--k", "17", "--n", "9",
                               "--sim", "model", "--config", "4x4")
    assert status == 0, err
    assert err == ""
    for text in ("20x17 @ 17x9", "config 4x4", "sim model", "bit-exact: yes",
                 "15 weight tiles"):
        assert text in out, out
    cycles = predict_gemm(NPUConfig.from_name("4x4"), 20, 17, 9).cycles
    lines = out.splitlines()
    assert f"cycles: {cycles} (predicted by the cycle model)" in lines
    assert (f"utilization: {20 * 17 * 9 / (cycles * 16):.1%} of 16 PEs (3060 MACs), "
            f"predicted") in lines


@pytest.mark.parametrize("config, bus_width, schedule", [
    ("8x8", "64", "auto"), ("5x7", "128", "resident"), ("1x1", "32", "streaming"),
    ("4x4", "32", "overlap"), ("4x4", "256", "auto"), ("8x4", "512", "resident")])
def test_gemm_on_the_model_predicts_cycles_and_counters(capsys, config, bus_width, schedule):
    """Exactly the cycle model's figures for the program the driver ran: same config, bus,
    schedule."""
    status, out, err = run_cli(capsys, "gemm", "--m", "37", "--k", "53", "--n", "29",
                               "--config", config, "--bus-width", bus_width, "--schedule",
                               schedule, "--sim", "model", "--json")
    assert status == 0, err
    report = json.loads(out)
    timing = predict_gemm(NPUConfig.from_name(config, bus_width=int(bus_width)), 37, 53, 29,
                          schedule=schedule)
    assert (report["cycles"], report["counters"]) == (timing.cycles, timing.perf)
    assert list(report["counters"]) == [*PERF_COUNTERS, "cycles"]


def test_gemm_json_keys_are_those_of_the_rtl(monkeypatch, capsys):
    """The model's report has the keys of an RTL backend's, which reports measured cycles."""
    argv = ["gemm", "--m", "9", "--k", "9", "--n", "9", "--config", "4x4", "--json"]
    status, out, err = run_cli(capsys, *argv, "--sim", "model")
    assert status == 0, err
    model = json.loads(out)
    run_on_model = backend.run_program

    def rtl_run_program(config, sim, dram, prog_addr, prog_len):
        result = run_on_model(config, "model", dram, prog_addr, prog_len)
        result.cycles = 1000
        result.perf = dict.fromkeys([*PERF_COUNTERS, "cycles"], 7)
        return result

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(rtl_run_program))
    status, out, err = run_cli(capsys, *argv, "--sim", "verilator")
    assert status == 0, err
    rtl = json.loads(out)
    assert set(rtl) == set(model)
    assert set(rtl["counters"]) == set(model["counters"])
    assert (rtl["cycles"], rtl["cycles_predicted"], rtl["counters"]["stall_load"]) == \
        (1000, False, 7)
    assert model["cycles_predicted"] is True


def test_gemm_memory_depth_options(capsys):
    status, out, err = run_cli(capsys, "gemm", "--m", "10", "--k", "3", "--n", "3",
                               "--config", "2x2", "--acc-depth", "4", "--spad-depth", "64",
                               "--schedule", "resident", "--sim", "model", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert (report["m_blocks"], report["block_rows"], report["acc_depth"]) == (3, 4, 4)


def test_gemm_user_matrices_round_trip(tmp_path, capsys):
    seed = 77
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, size=(11, 19), dtype=np.int8)
    b = rng.integers(-128, 128, size=(19, 23), dtype=np.int8)
    a[0, 0] = b[0, 0] = -128
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out_path = tmp_path / "c.npy"
    status, out, err = run_cli(capsys, "gemm", "--a", str(tmp_path / "a.npy"),
                               "--b", str(tmp_path / "b.npy"), "--out", str(out_path),
                               "--sim", "model", "--config", "8x8", "--json")
    print(f"seed {seed}")   # after the run: capsys would otherwise mix it into the JSON
    assert status == 0, err
    report = json.loads(out)
    assert (report["m"], report["k"], report["n"]) == (11, 19, 23)
    assert report["seed"] is None and report["bit_exact"] is True
    c = np.load(out_path)
    assert c.dtype == np.int32
    assert np.array_equal(c, reference_gemm(a, b))


def test_gemm_not_bit_exact_exits_1(monkeypatch, capsys):
    run_on_model = backend.run_program

    def corrupting_run_program(config, sim, dram, prog_addr, prog_len):
        result = run_on_model(config, "model", dram, prog_addr, prog_len)
        result.dram ^= 1               # flips the lowest bit of every element of C
        result.cycles = 500
        return result

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(corrupting_run_program))
    status, out, err = run_cli(capsys, "gemm", "--m", "3", "--k", "3", "--n", "3",
                               "--sim", "verilator", "--json")
    assert status == 1
    report = json.loads(out)
    assert report["bit_exact"] is False and report["mismatches"] > 0
    assert report["cycles"] == 500
    assert report["utilization"] == 27 / (500 * 64)
    assert err.startswith("npu: error: the result differs") and err.count("\n") == 1


def test_gemm_program_error_exits_1(monkeypatch, capsys):
    from hw.isa import ErrorCode

    def failing_run_program(config, sim, dram, prog_addr, prog_len):
        return RunResult(done=False, error_code=ErrorCode.ACC_RANGE, error_pc=3, cycles=10,
                         instructions=3, dram=dram)

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(failing_run_program))
    status, out, err = run_cli(capsys, "gemm", "--m", "2", "--k", "2", "--n", "2")
    assert_one_line_error(status, out, err, 1, "ACC_RANGE at instruction 3")


def test_missing_rtl_backend_exits_1(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sim.runner", None)
    status, out, err = run_cli(capsys, "gemm", "--m", "2", "--k", "2", "--n", "2",
                               "--sim", "icarus")
    assert_one_line_error(status, out, err, 1, "not available")


@pytest.mark.parametrize("command", ["gemm", "qgemm"])
def test_missing_icarus_exits_1_with_one_line(monkeypatch, capsys, command):
    """Without iverilog on PATH: sim.toolchain's message, alone, and no simulation started."""
    from sim import runner, toolchain

    def no_simulation(*arguments, **keywords):
        raise AssertionError("the RTL runner ran without Icarus")

    monkeypatch.setattr(toolchain.shutil, "which", lambda name: None)
    monkeypatch.setattr(runner, "run_programs", no_simulation)
    status, out, err = run_cli(capsys, command, "--m", "2", "--k", "2", "--n", "2",
                               "--sim", "icarus")
    assert (status, out) == (1, "")
    assert err == ("npu: error: Icarus Verilog is not installed: run 'sudo apt-get install -y "
                   "iverilog' (Debian/Ubuntu)\n")


# Bad input ------------------------------------------------------------------------------------

def save(tmp_path, name, array):
    path = tmp_path / name
    np.save(path, array)
    return str(path)


GOOD_B_SHAPE = (3, 4)


@pytest.mark.parametrize("a_value, b_value, match", [
    (np.ones((2, 3), np.float32), np.ones(GOOD_B_SHAPE, np.int8), "A must have dtype int8"),
    (np.ones((2, 3), np.int8), np.ones(GOOD_B_SHAPE, np.int16), "B must have dtype int8"),
    (np.ones((2, 3), np.bool_), np.ones(GOOD_B_SHAPE, np.int8), "not bool"),
    (np.ones((2, 5), np.int8), np.ones(GOOD_B_SHAPE, np.int8), "A is 2x5 and B is 3x4"),
    (np.ones((0, 3), np.int8), np.ones(GOOD_B_SHAPE, np.int8), "must not be empty"),
    (np.ones(3, np.int8), np.ones(GOOD_B_SHAPE, np.int8), "two-dimensional"),
    (np.ones((1, MAX_K + 1), np.int8), np.ones((MAX_K + 1, 1), np.int8), "MAX_K"),
])
def test_bad_matrices(tmp_path, capsys, a_value, b_value, match):
    status, out, err = run_cli(capsys, "gemm", "--a", save(tmp_path, "a.npy", a_value),
                               "--b", save(tmp_path, "b.npy", b_value), "--sim", "model")
    assert_one_line_error(status, out, err, 2, match)


def test_bad_files(tmp_path, capsys):
    good = save(tmp_path, "good.npy", np.ones((2, 2), np.int8))
    text = tmp_path / "text.npy"
    text.write_text("this is not\nan npy file\n")
    archive = tmp_path / "archive.npz"
    np.savez(archive, a=np.ones((2, 2), np.int8))
    objects = save(tmp_path, "objects.npy", np.array([[None, 1]], dtype=object))
    truncated = tmp_path / "truncated.npy"
    truncated.write_bytes(open(good, "rb").read()[:-2])
    for path, match in [(tmp_path / "missing.npy", "no such file"),
                        (text, "does not start with the NumPy magic string"),
                        (archive, "not a .npy file"),
                        (objects, "not a valid .npy file"),
                        (truncated, "not a valid .npy file"),
                        (tmp_path, "cannot be read")]:
        status, out, err = run_cli(capsys, "gemm", "--a", str(path), "--b", good,
                                   "--sim", "model")
        assert_one_line_error(status, out, err, 2, match)
        assert str(path) in err


@pytest.mark.parametrize("argv, match", [
    (["gemm", "--m", "0", "--k", "1", "--n", "1"], "--m: must be a positive integer"),
    (["gemm", "--m", "1", "--k", "-1", "--n", "1"], "--k: must be a positive integer"),
    (["gemm", "--m", "x", "--k", "1", "--n", "1"], "--m: 'x' is not an integer"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--config", "8"], "RxC"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--config", "0x4"], "RxC"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--config", "300x1"], "at most 256"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--spad-depth", "4"], "spad_depth"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--spad-depth", "8", "--sim", "model"],
     "cannot hold a weight tile"),
    (["gemm", "--m", "1", "--k", str(MAX_K + 1), "--n", "1", "--sim", "model"], "MAX_K"),
    (["gemm", "--m", "1", "--k", "1"], "--m, --k and --n are required"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--seed", "-1"], "non-negative"),
    (["gemm", "--m", "1", "--k", "1", "--n", "1", "--sim", "spice"], "invalid choice"),
    (["gemm", "--a", "a.npy"], "--a and --b must be given together"),
    (["gemm", "--a", "a.npy", "--b", "b.npy", "--m", "2"], "cannot be combined"),
    (["gemm", "--bogus"], "unrecognized arguments"),
    (["verilog", "--config", "8x8"], "-o"),
    ([], "required: command"),
    (["fly"], "invalid choice"),
])
def test_bad_arguments(capsys, argv, match):
    status, out, err = run_cli(capsys, *argv)
    assert_one_line_error(status, out, err, 2, match)


def test_help_exits_0(capsys):
    status, out, _ = run_cli(capsys, "gemm", "--help")
    assert status == 0
    assert "--config" in out


# verilog and trace ----------------------------------------------------------------------------

def test_verilog(monkeypatch, tmp_path, capsys):
    fake_top = types.ModuleType("hw.top")
    fake_top.generate_verilog = lambda config: f"module npu_top; // {config.name}\nendmodule\n"
    monkeypatch.setitem(sys.modules, "hw.top", fake_top)
    output = tmp_path / "npu.v"
    status, out, err = run_cli(capsys, "verilog", "--config", "3x5", "-o", str(output))
    assert status == 0, err
    assert output.read_text() == "module npu_top; // 3x5\nendmodule\n"


def test_verilog_unwritable_output(monkeypatch, tmp_path, capsys):
    fake_top = types.ModuleType("hw.top")
    fake_top.generate_verilog = lambda config: "module npu_top; endmodule\n"
    monkeypatch.setitem(sys.modules, "hw.top", fake_top)
    status, out, err = run_cli(capsys, "verilog", "-o", str(tmp_path / "no" / "such.v"))
    assert_one_line_error(status, out, err, 2, "cannot write")


def test_verilog_without_hw_top(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "hw.top", None)
    status, out, err = run_cli(capsys, "verilog", "-o", "unused.v")
    assert_one_line_error(status, out, err, 1, "hw.top")


def test_trace(monkeypatch, capsys):
    fake_trace = types.ModuleType("sim.trace")
    fake_trace.format_trace = lambda: "cycle 0: idle\ncycle 1: busy"
    monkeypatch.setitem(sys.modules, "sim.trace", fake_trace)
    status, out, err = run_cli(capsys, "trace")
    assert status == 0, err
    assert out == "cycle 0: idle\ncycle 1: busy\n"


def test_trace_without_sim_trace(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sim.trace", None)
    status, out, err = run_cli(capsys, "trace")
    assert_one_line_error(status, out, err, 1, "sim.trace")


# qgemm ----------------------------------------------------------------------------------------

QGEMM_JSON_KEYS = JSON_KEYS | {"mismatches", "a_zero_point", "out_zero_point", "act_min",
                               "act_max", "config", "out"}


def save_qgemm_operands(tmp_path, seed=88, m=11, k=19, n=23):
    from quant_cases import random_qgemm_problem
    rng = np.random.default_rng(seed)
    problem = random_qgemm_problem(rng, m, k, n)
    paths = {}
    for option, key in (("a", "A"), ("b", "B"), ("bias", "bias"),
                        ("multiplier", "multiplier"), ("shift", "shift")):
        paths[option] = save(tmp_path, f"{option}.npy", problem[key])
    return problem, paths


def qgemm_file_argv(paths, problem, *extra):
    argv = ["qgemm"]
    for option, path in paths.items():
        argv += [f"--{option}", path]
    argv += ["--out-zero-point", str(problem["out_zero_point"]),
             "--act-min", str(problem["act_min"]), "--act-max", str(problem["act_max"]),
             "--a-zero-point", str(problem["a_zero_point"])]
    return argv + list(extra)


def test_qgemm_files_json_and_out(tmp_path, capsys):
    from sw.driver import reference_qgemm
    problem, paths = save_qgemm_operands(tmp_path)
    out_path = tmp_path / "y.npy"
    status, out, err = run_cli(capsys, *qgemm_file_argv(
        paths, problem, "--config", "3x5", "--sim", "model", "--out", str(out_path), "--json"))
    print("seed 88")
    assert status == 0, err
    report = json.loads(out)
    assert QGEMM_JSON_KEYS <= set(report)
    assert (report["m"], report["k"], report["n"]) == (11, 19, 23)
    assert (report["rows"], report["cols"], report["sim"]) == (3, 5, "model")
    assert report["bit_exact"] is True and report["mismatches"] == 0
    assert report["seed"] is None and report["cycles"] is None
    assert report["a_zero_point"] == problem["a_zero_point"]
    assert (report["out_zero_point"], report["act_min"], report["act_max"]) == (
        problem["out_zero_point"], problem["act_min"], problem["act_max"])
    assert report["macs"] == 11 * 19 * 23
    y = np.load(out_path)
    assert y.dtype == np.int8 and y.shape == (11, 23)
    assert np.array_equal(y, reference_qgemm(**problem))
    assert out.count("\n") == 1


def test_qgemm_random_mode_readable(capsys):
    status, out, err = run_cli(capsys, "qgemm", "--m", "20", "--k", "30", "--n", "10",
                               "--config", "4x4", "--sim", "model", "--seed", "3")
    assert status == 0, err
    assert err == ""
    for text in ("qgemm 20x30 @ 30x10 -> 20x10 int8 (seed 3)", "config 4x4", "sim model",
                 "bit-exact: yes", "clamp -128 .. 127", "24 weight tiles"):
        assert text in out, out


def test_qgemm_random_mode_is_reproducible(tmp_path, capsys):
    results = []
    for index, seed in enumerate(("5", "5", "6")):
        out_path = tmp_path / f"y{index}.npy"
        status, _, err = run_cli(capsys, "qgemm", "--m", "9", "--k", "40", "--n", "9",
                                 "--sim", "model", "--seed", seed, "--a-zero-point", "-3",
                                 "--out", str(out_path))
        assert status == 0, err
        results.append(np.load(out_path))
    assert np.array_equal(results[0], results[1])
    assert not np.array_equal(results[0], results[2])
    assert len(np.unique(results[0])) > 20           # the outputs use the INT8 range


def test_qgemm_not_bit_exact_exits_1(monkeypatch, tmp_path, capsys):
    run_on_model = backend.run_program

    def corrupting_run_program(config, sim, dram, prog_addr, prog_len):
        result = run_on_model(config, "model", dram, prog_addr, prog_len)
        result.dram ^= 1
        result.cycles = 700
        return result

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(corrupting_run_program))
    problem, paths = save_qgemm_operands(tmp_path)
    status, out, err = run_cli(capsys, *qgemm_file_argv(paths, problem, "--sim", "verilator",
                                                        "--json"))
    assert status == 1
    report = json.loads(out)
    assert report["bit_exact"] is False and report["mismatches"] == 11 * 23
    assert report["cycles"] == 700 and report["sim"] == "verilator"
    assert err.startswith("npu: error: the result differs") and err.count("\n") == 1


def test_qgemm_program_error_exits_1(monkeypatch, capsys):
    from hw.isa import ErrorCode

    def failing_run_program(config, sim, dram, prog_addr, prog_len):
        return RunResult(done=False, error_code=ErrorCode.QUANT, error_pc=2, cycles=10,
                         instructions=2, dram=dram)

    monkeypatch.setattr(backend, "run_programs", one_at_a_time(failing_run_program))
    status, out, err = run_cli(capsys, "qgemm", "--m", "2", "--k", "2", "--n", "2")
    assert_one_line_error(status, out, err, 1, "QUANT at instruction 2")


@pytest.mark.parametrize("replace, match", [
    (dict(a=np.ones((11, 19), np.float64)), "A must have dtype int8"),
    (dict(b=np.ones((18, 23), np.int8)), "A is 11x19 and B is 18x23"),
    (dict(bias=np.zeros(23, np.int64)), "bias must have dtype int32"),
    (dict(bias=np.zeros(22, np.int32)), r"bias must have shape (23,)"),
    (dict(multiplier=np.zeros((23, 1), np.int32)), "multiplier must have shape"),
    (dict(shift=np.full(23, 40, np.int32)), "shift must be within -31 .. 31"),
])
def test_qgemm_bad_operand_files(tmp_path, capsys, replace, match):
    problem, paths = save_qgemm_operands(tmp_path)
    for option, value in replace.items():
        paths[option] = save(tmp_path, f"bad_{option}.npy", value)
    status, out, err = run_cli(capsys, *qgemm_file_argv(paths, problem, "--sim", "model"))
    assert_one_line_error(status, out, err, 2, match)


def test_qgemm_bad_files(tmp_path, capsys):
    problem, paths = save_qgemm_operands(tmp_path)
    text = tmp_path / "text.npy"
    text.write_text("not numpy\n")
    for path, match in [(tmp_path / "missing.npy", "no such file"),
                        (text, "does not start with the NumPy magic string")]:
        status, out, err = run_cli(capsys, *qgemm_file_argv(
            dict(paths, shift=str(path)), problem, "--sim", "model"))
        assert_one_line_error(status, out, err, 2, match)
        assert f"--shift {path}" in err


@pytest.mark.parametrize("argv, match", [
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--out-zero-point", "128"],
     "--out-zero-point: must be within -128 .. 127, not 128"),
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--act-min", "-129"], "--act-min"),
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--act-max", "x"],
     "--act-max: 'x' is not an integer"),
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--a-zero-point", "1000"],
     "--a-zero-point"),
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--act-min", "5", "--act-max", "4",
      "--sim", "model"], "act_min must not exceed act_max"),
    (["qgemm", "--m", "2", "--k", "2"], "--m, --k and --n are required"),
    (["qgemm", "--a", "a.npy", "--b", "b.npy"],
     "--bias, --multiplier, --shift must be given too"),
    (["qgemm", "--a", "a.npy", "--b", "b.npy", "--bias", "c.npy", "--multiplier", "d.npy",
      "--shift", "e.npy", "--m", "3"], "cannot be combined"),
    (["qgemm", "--a", "a.npy", "--b", "b.npy", "--bias", "c.npy", "--multiplier", "d.npy",
      "--shift", "e.npy", "--act-min", "0"], "--out-zero-point, --act-max required"),
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--sim", "spice"], "invalid choice"),
    (["qgemm", "--m", "2", "--k", "2", "--n", "2", "--config", "2"], "RxC"),
])
def test_qgemm_bad_arguments(capsys, argv, match):
    status, out, err = run_cli(capsys, *argv)
    assert_one_line_error(status, out, err, 2, match)


# npu plan ---------------------------------------------------------------------------------------

def test_plan_reproduces_the_seeds_tiling_example(capsys):
    """Seeds section 4.1: a 1x1 conv, C_in = C_out = 100, 56 x 56 outputs, on 64x64."""
    status, out, err = run_cli(capsys, "plan", "--m", "3136", "--k", "100", "--n", "100",
                               "--rows", "64", "--cols", "64", "--json")
    assert status == 0, err
    report = json.loads(out)
    assert (report["weight_tiles"], report["k_tiles"], report["n_tiles"]) == (4, 2, 2)
    assert (report["useful_pe_cells"], report["provisioned_pe_cells"]) == (10_000, 16_384)
    assert f"{report['mapping_efficiency']:.1%}" == "61.0%"
    assert report["predicted_cycles"] > 0 and 0 < report["predicted_utilization"] <= 1
    # SCALE-Sim's weight-stationary figure: 4 * (2 * 64 + 64 + 3136 - 2) cycles.
    assert report["scalesim_cycles"] == 4 * (2 * 64 + 64 + 3136 - 2)
    status, out, _ = run_cli(capsys, "plan", "--m", "3136", "--k", "128", "--n", "128",
                             "--rows", "64", "--cols", "64", "--json")
    report = json.loads(out)
    assert report["weight_tiles"] == 4 and report["mapping_efficiency"] == 1.0


def test_plan_readable_and_scalesim_reference(capsys):
    status, out, _ = run_cli(capsys, "plan", "--m", "256", "--k", "256", "--n", "256",
                             "--config", "16x16", "--bus-width", "128")
    assert status == 0
    assert "weight tiles: 256 (16 x 16)" in out
    assert "mapping efficiency: 65,536 / 65,536 = 100.0%" in out
    # The reference: 16 * 16 * (32 + 16 + 256 - 2) = 77,312 cycles, 84.8%.
    assert "SCALE-Sim weight-stationary model: 77,312 cycles, utilization 84.8%" in out


@pytest.mark.rtl
@pytest.mark.parametrize("shape, config, bus_width", [
    ((37, 53, 29), "8x8", "64"),       # shapes and configs outside tb/test_timing.py's sweep
    ((130, 21, 45), "3x5", "32"),
    ((64, 20, 3), "1x1", "128"),
])
def test_plan_predicts_gemm_cycles_exactly(capsys, shape, config, bus_width):
    m, k, n = (str(x) for x in shape)
    common = ["--m", m, "--k", k, "--n", n, "--config", config, "--bus-width", bus_width,
              "--json"]
    status, out, err = run_cli(capsys, "plan", *common)
    assert status == 0, err
    plan = json.loads(out)
    status, out, err = run_cli(capsys, "gemm", *common, "--sim", "verilator", "--seed", "3")
    assert status == 0, err
    run = json.loads(out)
    assert run["bit_exact"] is True
    assert plan["predicted_cycles"] == run["cycles"]
    assert plan["predicted_counters"] == run["counters"]


@pytest.mark.parametrize("config_arguments, bus_width", [
    (["--config", "8x8"], 64), (["--config", "16x16"], 128),
    (["--rows", "32", "--cols", "8"], 256), (["--config", "64x64"], 512),
    (["--config", "32x32", "--bus-width", "64"], 64),
    (["--config", "4x4", "--bus-width", "512"], 512),
    (["--config", "2x2", "--bus-width", "256"], 256)])
def test_plan_bus_width(capsys, config_arguments, bus_width):
    """The bus carries an activation row a beat unless --bus-width says otherwise, and the
    cycles are the model's for that bus."""
    status, out, err = run_cli(capsys, "plan", "--m", "20", "--k", "30", "--n", "10",
                               *config_arguments, "--json")
    assert status == 0, err
    report = json.loads(out)
    assert report["bus_width"] == bus_width
    config = NPUConfig(rows=report["rows"], cols=report["cols"], bus_width=bus_width)
    assert report["predicted_cycles"] == predict_gemm(config, 20, 30, 10).cycles


@pytest.mark.parametrize("argv, match", [
    (["plan", "--m", "1", "--k", "1"], "required: --n"),
    (["plan", "--m", "1", "--k", "1", "--n", "1", "--rows", "4"], "--rows and --cols"),
    (["plan", "--m", "1", "--k", "1", "--n", "1", "--rows", "300", "--cols", "4"],
     "at most 256"),
    (["plan", "--m", "1", "--k", "1", "--n", "1", "--bus-width", "48"], "invalid choice"),
])
def test_plan_bad_arguments(capsys, argv, match):
    status, out, err = run_cli(capsys, *argv)
    assert_one_line_error(status, out, err, 2, match)


@pytest.mark.rtl
def test_gemm_reports_its_wall_time_on_the_rtl_only(capsys):
    """An RTL run ends with its wall time and simulated cycles per second (so a user sees the
    simulator's speed); the model, which has no clock, prints none."""
    common = ["gemm", "--m", "9", "--k", "9", "--n", "9", "--config", "4x4"]
    status, out, err = run_cli(capsys, *common, "--sim", "verilator")
    assert status == 0, err
    last = out.splitlines()[-1]
    assert last.startswith("wall time: ") and last.endswith(" simulated cycles/s"), last
    status, out, err = run_cli(capsys, *common, "--sim", "model")
    assert status == 0, err
    assert "wall time" not in out
    status, out, err = run_cli(capsys, *common, "--sim", "model", "--json")
    assert json.loads(out)["wall_seconds"] > 0
