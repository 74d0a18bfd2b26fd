"""`make verilog` / `npu verilog`: the Verilog compiles under Icarus and passes Verilator lint."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sim.toolchain import setup_verilator
from sw import cli


pytestmark = pytest.mark.rtl

LINT_WAIVERS = Path(__file__).resolve().parent.parent / "sim" / "lint.vlt"

AXI_PORTS = ["m_axi_awaddr", "m_axi_awlen", "m_axi_wdata", "m_axi_wstrb", "m_axi_wlast",
             "m_axi_bresp", "m_axi_araddr", "m_axi_arlen", "m_axi_rdata", "m_axi_rlast",
             "s_axil_awaddr", "s_axil_wdata", "s_axil_bresp", "s_axil_araddr",
             "s_axil_rdata", "irq", "clk", "rst"]


@pytest.fixture(scope="module", params=["4x4", "3x5"])
def verilog_file(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("verilog") / f"npu_{request.param}.v"
    assert cli.main(["verilog", "--config", request.param, "-o", str(path)]) == 0
    return path


def test_top_level_ports(verilog_file):
    text = verilog_file.read_text()
    header = re.search(r"module npu_top\((.*?)\);", text, re.S)
    assert header, "no module npu_top"
    ports = {port.strip() for port in header.group(1).split(",")}
    for port in AXI_PORTS:
        assert port in ports, f"port {port} missing from npu_top"


def test_icarus_compiles(verilog_file, tmp_path):
    if shutil.which("iverilog") is None:
        pytest.fail("Icarus Verilog is not installed (apt-get install -y iverilog)")
    result = subprocess.run(["iverilog", "-g2005", "-s", "npu_top", "-o",
                             str(tmp_path / "npu.vvp"), str(verilog_file)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_verilator_lint(verilog_file):
    """-Wall is clean apart from the warning classes waived, with reasons, in sim/lint.vlt."""
    setup_verilator()
    result = subprocess.run(["verilator", "--lint-only", "-Wall", str(LINT_WAIVERS),
                             "--top-module", "npu_top", str(verilog_file)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "%Error" not in result.stderr and "%Warning" not in result.stderr, result.stderr


def test_convert_refuses_an_output_that_nothing_drives():
    """hw.top.convert names ports with Amaranth's public ``ports=`` form, which infers each
    direction; an output member that nothing drives would silently become an input."""
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    from hw.top import convert

    class Block(wiring.Component):
        a: In(4)
        b: Out(4)
        c: Out(1)

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.b.eq(self.a)
            return m

    with pytest.raises(ValueError, match="port c of block would be an input, but its member "
                                         "is an output"):
        convert(Block(), name="block")
