"""Real networks fit (issue 51, point 3): the RTL's simulated DRAM is sized to the program's
image, up to the 4 GiB the DMA addresses; ``npu onnx --plan`` says how much DRAM each NPU
program needs and errs in one line when one does not fit; the backends refuse an image too
large for them before anything runs.

The RTL cases run a GEMM whose operands and result sit above 16 MiB (the default build's
size) in an image of 20 MiB: the runner builds the 64 MiB class for it, once per
configuration (about 40 s for 2x2 under Verilator), then every run takes seconds. A
``npu gemm`` whose matrices alone exceed 16 MiB runs with ``NPU_FULL=1``.
"""

import json
import os

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.isa import ErrorCode
from sim import dram as hdl_dram
from sw.errors import NPUValueError


FULL = os.environ.get("NPU_FULL") == "1"
MiB = 1 << 20


# The size classes ----------------------------------------------------------------------------

def test_size_classes():
    from sim.dram import DRAM_BYTES, MAX_DRAM_BYTES, SIZE_CLASSES, size_class
    assert SIZE_CLASSES == (16 * MiB, 64 * MiB, 256 * MiB, 1 << 30, 1 << 32)
    assert DRAM_BYTES == SIZE_CLASSES[0] and MAX_DRAM_BYTES == SIZE_CLASSES[-1]
    assert size_class(1) == size_class(16 * MiB) == 16 * MiB
    assert size_class(16 * MiB + 1) == 64 * MiB
    assert size_class(103 * 10 ** 6) == 256 * MiB          # AlexNet's largest program
    assert size_class(1 << 32) == 1 << 32
    with pytest.raises(ValueError, match="larger than the 4,294,967,296 bytes"):
        size_class((1 << 32) + 1)


def test_capacity_from_env(monkeypatch):
    from sim.dram import CAPACITY_ENV, capacity_from_env
    monkeypatch.delenv(CAPACITY_ENV, raising=False)
    assert capacity_from_env() == 16 * MiB
    monkeypatch.setenv(CAPACITY_ENV, str(256 * MiB))
    assert capacity_from_env() == 256 * MiB
    for bad in ("1000", "lots", "-1"):
        monkeypatch.setenv(CAPACITY_ENV, bad)
        with pytest.raises(ValueError, match=CAPACITY_ENV):
            capacity_from_env()


def test_hdl_dram_size_is_bounded():
    from sim.dram import HDLDram
    assert HDLDram(data_width=64, size=1 << 32).size == 1 << 32
    with pytest.raises(ValueError, match="at most 4294967296"):
        HDLDram(data_width=64, size=(1 << 32) + 8)


def test_each_size_class_is_a_build_of_its_own():
    """The default class keeps the build folder it always had; the others have a tag before
    the gateware hash (which the pruning of stale builds reads), and the cocotbext DRAM,
    which is not part of the build, has none."""
    from sim import runner
    config = NPUConfig.from_name("2x2")
    names = {size: runner._build_dir(config, "verilator", "hdl", size).name
             for size in hdl_dram.SIZE_CLASSES}
    digest = runner._gateware_hash()
    assert names[16 * MiB] == f"{config.key()}-hdl-{digest}"
    assert names[64 * MiB] == f"{config.key()}-hdl-64m-{digest}"
    assert names[1 << 32] == f"{config.key()}-hdl-4g-{digest}"
    assert len(set(names.values())) == len(names)
    assert runner._build_dir(config, "verilator", "cocotbext", 16 * MiB).name == \
        f"{config.key()}-cocotbext-{digest}"
    for name in names.values():
        assert runner._BUILD_NAME.search(name)["hash"] == digest
    with pytest.raises(ValueError, match="dram_bytes must be one of"):
        runner._dram_bytes("hdl", 32 * MiB)


# The bench's hex files -------------------------------------------------------------------------

@pytest.mark.parametrize("bus_bytes", [4, 8, 16, 64])
def test_memh_round_trip(tmp_path, bus_bytes):
    """What the bench writes for ``$readmemh`` reads back as the same bytes, in pieces
    (three of them here) as for a large image."""
    from unittest import mock
    from sim import bench
    image = np.random.default_rng(bus_bytes).integers(0, 256, 25 * bus_bytes, dtype=np.uint8)
    path = tmp_path / "dram.hex"
    with mock.patch.object(bench, "_MEMH_CHUNK_WORDS", 10):
        bench._write_memh(path, image, bus_bytes)
        lines = path.read_text().splitlines()
        assert len(lines) == 25 and all(len(line) == 2 * bus_bytes for line in lines)
        assert int(lines[1], 16) == int.from_bytes(image[bus_bytes:2 * bus_bytes], "little")
        assert np.array_equal(bench._read_memh(path, bus_bytes).reshape(-1), image)


def test_memh_reads_what_icarus_writes(tmp_path):
    """Icarus's ``$writememh`` puts an address comment before every 16 words; a short word
    or an unknown digit goes through the line-by-line reader (which keeps its errors)."""
    from sim import bench
    words = [f"{value:016x}" for value in range(0, 40 * 0x0101010101, 0x0101010101)]
    lines = []
    for index, word in enumerate(words):
        if index % 16 == 0:
            lines.append(f"// 0x{index:08x}")
        lines.append(word)
    path = tmp_path / "dump.hex"
    path.write_text("\n".join(lines) + "\n")
    read = bench._read_memh(path, 8)
    assert [int.from_bytes(row.tobytes(), "little") for row in read] == \
        [int(word, 16) for word in words]
    path.write_text("1\n0a\n")
    assert bench._read_memh(path, 1).reshape(-1).tolist() == [1, 10]
    path.write_text("0x\n")
    with pytest.raises(ValueError):
        bench._read_memh(path, 1)


# The memory alone: bus words per entry -----------------------------------------------------------

def test_words_per_entry():
    """One bus word an entry, but where Verilator would refuse the memory (2^29 entries):
    the 4 GiB class on a 64-bit bus holds two an entry, on a 32-bit bus four."""
    from sim.dram import MAX_ENTRIES, words_per_entry
    assert MAX_ENTRIES == 1 << 28
    assert words_per_entry(8, 16 * MiB) == words_per_entry(8, 1 << 30) == 1
    assert words_per_entry(8, 1 << 32) == 2
    assert words_per_entry(4, 1 << 32) == 4 and words_per_entry(4, 1 << 30) == 1
    assert words_per_entry(64, 1 << 32) == 1


#: The DRAM with the AXI4 signals it ignores (cocotbext-axi's master drives them).
DRAM_ALONE = """\
module dram_alone #(parameter DATA_WIDTH = 64, parameter WORDS = 64, parameter RATIO = 1) (
    input wire clk, input wire rst,
    input wire [0:0] s_awid, input wire [31:0] s_awaddr, input wire [7:0] s_awlen,
    input wire [2:0] s_awsize, input wire [1:0] s_awburst, input wire s_awvalid,
    output wire s_awready,
    input wire [DATA_WIDTH-1:0] s_wdata, input wire [DATA_WIDTH/8-1:0] s_wstrb,
    input wire s_wlast, input wire s_wvalid, output wire s_wready,
    output wire [0:0] s_bid, output wire [1:0] s_bresp, output wire s_bvalid,
    input wire s_bready,
    input wire [0:0] s_arid, input wire [31:0] s_araddr, input wire [7:0] s_arlen,
    input wire [2:0] s_arsize, input wire [1:0] s_arburst, input wire s_arvalid,
    output wire s_arready,
    output wire [0:0] s_rid, output wire [DATA_WIDTH-1:0] s_rdata, output wire [1:0] s_rresp,
    output wire s_rlast, output wire s_rvalid, input wire s_rready,
    input wire [2:0] command, input wire [31:0] words, input wire [32:0] size,
    input wire [131:0] fault_lo, input wire [131:0] fault_hi, input wire [15:0] fault_kind,
    input wire bp_enable, input wire [31:0] bp_seed, input wire [79:0] bp_free_max,
    input wire [3:0] bp_pause_max, input wire [3:0] bp_latency_max, input wire drop_writes);
    npu_axi_dram #(.DATA_WIDTH(DATA_WIDTH), .WORDS(WORDS), .RATIO(RATIO)) dram (
        .clk(clk), .rst(rst),
        .s_awid(s_awid), .s_awaddr(s_awaddr), .s_awlen(s_awlen), .s_awvalid(s_awvalid),
        .s_awready(s_awready), .s_wdata(s_wdata), .s_wstrb(s_wstrb), .s_wlast(s_wlast),
        .s_wvalid(s_wvalid), .s_wready(s_wready), .s_bid(s_bid), .s_bresp(s_bresp),
        .s_bvalid(s_bvalid), .s_bready(s_bready), .s_arid(s_arid), .s_araddr(s_araddr),
        .s_arlen(s_arlen), .s_arvalid(s_arvalid), .s_arready(s_arready), .s_rid(s_rid),
        .s_rdata(s_rdata), .s_rresp(s_rresp), .s_rlast(s_rlast), .s_rvalid(s_rvalid),
        .s_rready(s_rready), .command(command), .words(words), .size(size),
        .fault_lo(fault_lo), .fault_hi(fault_hi), .fault_kind(fault_kind),
        .bp_enable(bp_enable), .bp_seed(bp_seed), .bp_free_max(bp_free_max),
        .bp_pause_max(bp_pause_max), .bp_latency_max(bp_latency_max),
        .drop_writes(drop_writes));
endmodule
"""


@pytest.mark.rtl
@pytest.mark.parametrize("bus_bytes, words, ratio", [(8, 64, 1), (8, 64, 2), (4, 128, 4),
                                                     (16, 32, 2)])
def test_dram_entries(bus_bytes, words, ratio, tmp_path):
    """``sim/hdl/npu_axi_dram.v`` built alone (Icarus, a few seconds) with ``RATIO`` bus
    words an entry: every word reads back where the bench's load file put it, partial
    writes land in their lane, the dump and the write log read back as the bench reads them,
    and a beat past the image is answered SLVERR (tb/cocotb_dram_size.py)."""
    import sys
    from cocotb_tools.runner import get_results, get_runner
    from sim.dram import VERILOG_SOURCE
    from sim.runner import BUILD_ROOT, ICARUS_ARGS, PROJECT_ROOT, TIMESCALE
    from sim.toolchain import setup
    setup("icarus")
    runner = get_runner("icarus")
    build_dir = BUILD_ROOT / "sim" / "icarus-dram" / f"{bus_bytes}-{words}-{ratio}"
    build_dir.mkdir(parents=True, exist_ok=True)
    wrapper = build_dir / "dram_alone.v"
    wrapper.write_text(DRAM_ALONE)
    runner.build(sources=[wrapper, VERILOG_SOURCE], hdl_toplevel="dram_alone",
                 build_dir=build_dir,
                 parameters={"DATA_WIDTH": 8 * bus_bytes, "WORDS": words, "RATIO": ratio},
                 build_args=ICARUS_ARGS, timescale=TIMESCALE, always=True,
                 log_file=build_dir / "build.log")
    if str(PROJECT_ROOT) not in sys.path:
        sys.path.append(str(PROJECT_ROOT))
    results = tmp_path / "results.xml"
    try:
        runner.test(test_module="tb.cocotb_dram_size", hdl_toplevel="dram_alone",
                    hdl_toplevel_lang="verilog", build_dir=build_dir, test_dir=tmp_path,
                    results_xml=results, timescale=TIMESCALE, log_file=tmp_path / "sim.log",
                    extra_env={"DRAM_BUS_BYTES": str(bus_bytes), "DRAM_WORDS": str(words),
                               "DRAM_RATIO": str(ratio)})
    except SystemExit:
        pass
    tests, failures = get_results(results)
    assert tests == 1 and failures == 0, (tmp_path / "sim.log").read_text()[-3000:]


# On the RTL ------------------------------------------------------------------------------------

def above_16_mib(config, size=20 * MiB):
    """Two programs in a ``size``-byte image: a small GEMM whose A, B and C lie in the
    image's last 4 KiB, above the default build's 16 MiB, and one whose A lies past the
    image (a read the DRAM answers SLVERR: the memory of the 64 MiB class reaches there,
    but the image does not). Returns the programs and the expected C."""
    from sw.compiler import compile_gemm
    m, k, n = 5, 7, 3
    rng = np.random.default_rng(51)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a_addr, b_addr, c_addr = size - 4096, size - 2048, size - 1024
    programs = []
    for a_at in (a_addr, size + 4096):
        program = compile_gemm(config, m, k, n, a_addr=a_at, b_addr=b_addr, c_addr=c_addr)
        dram = np.zeros(size, np.uint8)
        dram[0x40:0x40 + len(program.bytes)] = np.frombuffer(program.bytes, np.uint8)
        dram[a_addr:a_addr + a.size] = a.view(np.uint8).reshape(-1)
        dram[b_addr:b_addr + b.size] = b.view(np.uint8).reshape(-1)
        programs.append((dram, 0x40, len(program)))
    return programs, c_addr, a.astype(np.int32) @ b.astype(np.int32)


RTL_CASES = ["verilator"] + (["icarus"] if FULL else [])


@pytest.mark.rtl
@pytest.mark.parametrize("sim", RTL_CASES)
def test_image_above_16_mib_runs_on_the_rtl(sim):
    from sim.runner import run_programs
    config = NPUConfig.from_name("2x2")
    programs, c_addr, expected = above_16_mib(config)
    first, past = run_programs(config, sim, programs)
    assert first.done and first.error_code is ErrorCode.NONE, first
    m, n = expected.shape
    assert np.array_equal(first.dram[c_addr:c_addr + 4 * m * n].view("<i4").reshape(m, n),
                          expected)
    assert len(first.dram) == 20 * MiB
    # Past the image: an error status, not a hang, whatever the memory behind it.
    assert not past.done and past.error_code is ErrorCode.BUS_READ, past


@pytest.mark.rtl
@pytest.mark.skipif(not FULL, reason="NPU_FULL=1 (make test-full) runs it")
def test_npu_gemm_larger_than_16_mib_on_verilator(capsys):
    """``npu gemm`` whose A, B and C take 20.5 MiB (C alone 16 MiB) runs bit-exactly under
    Verilator (the 64 MiB class of 8x8; about 10 s of simulation)."""
    from sw.cli import main
    m, k, n = 65536, 8, 64
    assert m * k + k * n + 4 * m * n > 16 * MiB
    status = main(["gemm", "--m", str(m), "--k", str(k), "--n", str(n), "--config", "8x8",
                   "--sim", "verilator", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["bit_exact"], report


# The backends' check ---------------------------------------------------------------------------

def test_backends_refuse_an_image_too_large_before_running():
    from sw import backend
    config = NPUConfig.from_name("2x2")
    assert backend.dram_capacity(config, "model") == 1 << 32
    assert backend.dram_capacity(config, "verilator") == 1 << 32
    assert backend.dram_capacity(config, "soc") == 32 * MiB
    small = (np.zeros(64, np.uint8), 0x40, 1)
    large = (np.zeros(32 * MiB + 4096, np.uint8), 0x40, 1)      # calloc'd: never touched
    with pytest.raises(NPUValueError, match=r"program 1 of 2 and its data take 33,558,528 "
                                            r"bytes of DRAM; the SoC's SDRAM holds "
                                            r"33,554,432 \(--sim soc\)"):
        backend.run_programs(config, "soc", [small, large])
    huge = (np.zeros((1 << 32) + 4096, np.uint8), 0x40, 1)
    for sim in ("model", "verilator", "icarus"):
        with pytest.raises(NPUValueError, match="a 32-bit address reaches 4,294,967,296"):
            backend.run_programs(config, sim, [huge])
    with pytest.raises(NPUValueError, match="the program and its data take"):
        backend.run_program(config, "model", *huge)


# npu onnx --plan -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def conv_model(tmp_path_factory):
    """The quantized residual block (convolutions on the NPU, the residual Add on the host)
    and its input shape."""
    import logging
    from sw.onnx import models
    logging.getLogger("root").setLevel(logging.ERROR)
    float_model, shape = models.build("residual", seed=0)
    path = tmp_path_factory.mktemp("residual") / "residual.onnx"
    models.quantize(float_model, path, models.calibration_data(shape, seed=1))
    return str(path), shape


def plan_json(capsys, *argv):
    from sw.cli import main
    status = main(["onnx", *map(str, argv), "--plan", "--json"])
    captured = capsys.readouterr()
    return status, json.loads(captured.out) if captured.out else None, captured.err


def test_plan_reports_the_dram_of_each_program(conv_model, capsys, tmp_path):
    """``--plan`` gives each group's DRAM for one program of ``--batch`` samples: the size of
    the image the run builds, to the byte, and the largest and the sum over the run."""
    from sw.ir.grouping import NpuGroup, schedule
    from sw.ir.placement import place
    from sw.ir.runner import group_input
    from sw.nn.program import build_fused_program
    from sw.onnx.graph import import_model
    from sw.onnx.lower import to_graph
    from sw.onnx.runtime import infer_shapes
    path, shape = conv_model
    x = np.random.default_rng(3).standard_normal((10, *shape)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    status, report, err = plan_json(capsys, path, "--input", tmp_path / "x.npy", "--batch", 4)
    assert status == 0, err
    assert report["samples"] == 10 and report["batch"] == 4
    graph = import_model(path)
    shapes = infer_shapes(graph, x[:4])
    core = to_graph(graph, shapes)
    groups = [step for step in schedule(core, place(core)) if isinstance(step, NpuGroup)]
    assert len(groups) == len(report["groups"]) >= 1
    config = NPUConfig.from_name("8x8")            # npu onnx's default
    sizes = []
    for group, planned in zip(groups, report["groups"]):
        x_q = group_input(core, group, np.zeros(shapes[group.input], dtype=np.int8))
        image = build_fused_program(config, group.ops, x_q)
        assert planned["dram_bytes"] == image.dram.size
        assert planned["instructions"] == image.program_len
        assert planned["programs"] == 3
        assert {name: (region["addr"], region["bytes"])
                for name, region in planned["regions"].items()} == image.regions
        sizes.append(image.dram.size)
    dram = report["dram"]
    assert dram["largest_program"] == max(sizes)
    assert dram["all_programs"] == 3 * sum(sizes)
    assert (dram["sim"], dram["capacity"], dram["fits"]) == ("model", 1 << 32, True)

    from sw.cli import main
    assert main(["onnx", path, "--plan", "--input", str(tmp_path / "x.npy"), "--batch", "4",
                 "--sim", "verilator"]) == 0
    out = capsys.readouterr().out
    assert f"DRAM: {max(sizes):,} bytes" in out
    assert "--sim verilator holds 4,294,967,296 (4.0 GiB)" in out


def test_plan_errs_in_one_line_when_a_program_does_not_fit(conv_model, capsys, monkeypatch):
    """A program larger than what ``--sim`` holds: the plan is printed, then one line of
    error, exit status 2."""
    from sw import backend
    from sw.cli import main
    path, _ = conv_model
    monkeypatch.setattr(backend, "dram_capacity", lambda config, sim: 1024)
    status = main(["onnx", path, "--plan", "--sim", "soc"])
    captured = capsys.readouterr()
    assert status == 2
    assert "NPU group 0:" in captured.out
    assert captured.err.startswith("npu: error: NPU group ")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert "bytes of DRAM (program and data), more than the 1,024 of --sim soc" in captured.err
    status, report, err = plan_json(capsys, path, "--sim", "soc")
    assert status == 2 and report["dram"]["fits"] is False and err.startswith("npu: error:")


def test_an_image_beyond_4_gib_is_refused_before_compiling():
    """The layout says how large the image is before anything is compiled, and building it
    stops there when the DMA's 32-bit addresses cannot reach it all (a dense layer of 8192
    features on 300,000 samples: 4.9 GB of activations, 7 GB of program)."""
    from unittest import mock
    from sw.compiler import quantized
    from sw.nn.program import build_fused_program, check_addressable, layout_fused_program
    from sw.nn.quantize import QDense, QParams
    features = 8192
    op = QDense(name="fc", sources=("input",), weight=np.zeros((features, features), np.int8),
                bias=np.zeros(features, np.int32), weight_scale=np.ones(features),
                input=QParams(0.1, 0), output=QParams(0.1, 0),
                multiplier=np.full(features, 1 << 30, np.int32),
                shift=np.zeros(features, np.int32), act_min=-128, act_max=127, relu=False,
                input_shape=(features,), output_shape=(features,))
    config = NPUConfig.from_name("8x8")
    layout = layout_fused_program(config, [op], 300_000)
    assert layout.dram_bytes > 1 << 32
    assert layout.regions["fc"][1] == 300_000 * features
    check_addressable(config, 1 << 32)
    with pytest.raises(NPUValueError, match=r"need [\d,]+ bytes of DRAM, more than the 4 GiB "
                                            r"a 32-bit address reaches"):
        check_addressable(config, layout.dram_bytes)
    samples = np.zeros((300_000, features), np.int8)        # calloc'd: never touched
    with mock.patch.object(quantized, "_emit_quantized",
                           side_effect=AssertionError("compiled")), \
            pytest.raises(NPUValueError, match="more than the 4 GiB"):
        build_fused_program(config, [op], samples)
