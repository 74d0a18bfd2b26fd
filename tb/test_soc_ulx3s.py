"""The ULX3S build of the LiteX SoC (:mod:`soc.ulx3s`) without the tools: the SoC for the
ULX3S-85F elaborates and LiteX writes its Verilog, constraints and build script; the PLL makes
the system clock asked for; the wrapper scripts run the YoWASP tools; the report reader takes
nextpnr's JSON. Synthesis, place and route are measured by ``python -m soc.ulx3s``
(docs/board.md), not run here.
"""

import json
import os
import re
import subprocess

import pytest

from hw.config import NPUConfig
from soc.npu import TOP_NAME
from soc.ulx3s import (BOARDS, BUILD_NAME, SYS_CLK_FREQ, TOOLS, ULX3SNPUSoC, build, pll_config,
                       read_report, tool_wrappers)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The 85F's SoC with a 2x2 NPU, written by LiteX without running the tools."""
    folder = tmp_path_factory.mktemp("ulx3s")
    report = build("ulx3s-85f", NPUConfig.from_name("2x2"), folder=folder, run=False,
                   log=lambda *_: None)
    return folder, report


def test_soc_verilog_holds_npu_and_uart_bridge(sources):
    folder, report = sources
    gateware = folder / "gateware"
    assert report["bitstream"] is None and report["device"] == "LFE5U-85F"
    soc = (gateware / f"{BUILD_NAME}.v").read_text()
    # The NPU's module, instantiated once, from the Verilog the script reads.
    assert len(re.findall(rf"^{TOP_NAME} npu\(", soc, re.M)) == 1
    script = (gateware / f"{BUILD_NAME}.ys").read_text()
    npu_verilog = folder / "npu" / "npu_2x2.v"
    assert f"read_verilog {npu_verilog}" in script
    assert f"module {TOP_NAME}(" in npu_verilog.read_text()
    # The UART bridge on the FT231X's pins, the SDRAM clock and the ESP32's pin.
    assert "uartbone" in soc and "EHXPLLL" in soc
    constraints = (gateware / f"{BUILD_NAME}.lpf").read_text()
    for port, site in (("serial_tx", "L4"), ("serial_rx", "M1"), ("sdram_clock", "F19"),
                       ("wifi_gpio0", "F1"), ("clk25", "G2")):
        assert f'LOCATE COMP "{port}" SITE "{site}";' in constraints
    # The build script names the tools the wrappers provide, and asks nextpnr for its report.
    build_script = (gateware / f"build_{BUILD_NAME}.sh").read_text()
    for tool in TOOLS:
        assert re.search(rf"^{tool} ", build_script, re.M), tool
    assert "--report nextpnr.json" in build_script and "--85k" in build_script


def test_host_description_beside_the_build(sources):
    folder, _ = sources
    description = json.loads((folder / "soc.json").read_text())
    assert NPUConfig.from_json(description["config"]) == NPUConfig.from_name("2x2")
    assert description["sys_clk_freq"] == SYS_CLK_FREQ
    assert set(description["dfii"]) == {"control", "pi0_command", "pi0_command_issue",
                                         "pi0_address", "pi0_baddress"}


def test_pll_makes_the_system_clock(sources):
    _, report = sources
    for sys_clk_freq in (SYS_CLK_FREQ, 40_000_000, 60_000_000):
        config = pll_config(sys_clk_freq)
        # LiteX's margin: 1 %; 25 MHz x 16 / 8 is exactly 50 MHz.
        assert abs(config["clko0_freq"] - sys_clk_freq) <= 0.01 * sys_clk_freq
        assert config["clko1_freq"] == config["clko0_freq"] and config["clko1_phase"] == 90
    assert pll_config(SYS_CLK_FREQ)["clko0_freq"] == SYS_CLK_FREQ
    assert report["pll"] == json.loads(json.dumps(pll_config(SYS_CLK_FREQ)))


def test_bad_board_and_clock_are_refused(tmp_path):
    with pytest.raises(ValueError, match="board must be one of ulx3s-25f"):
        ULX3SNPUSoC("ulx3s-12f", NPUConfig.from_name("2x2"), build_dir=tmp_path)
    with pytest.raises(ValueError, match="sys_clk_freq must be a positive integer"):
        ULX3SNPUSoC("ulx3s-85f", NPUConfig.from_name("2x2"), build_dir=tmp_path,
                    sys_clk_freq=50e6)
    assert set(BOARDS) == {"ulx3s-25f", "ulx3s-45f", "ulx3s-85f"}


def test_wrappers_run_the_yowasp_tools(tmp_path):
    folder = tool_wrappers(tmp_path / "bin")
    for name, wheel in TOOLS.items():
        script = folder / name
        assert os.access(script, os.X_OK)
        assert re.fullmatch(rf'#!/bin/sh\nexec "[^"]*{wheel}" "\$@"\n', script.read_text())
    # The wrapper passes its arguments on: ecppack (the smallest tool) prints its help.
    env = dict(os.environ, PATH=f"{folder}{os.pathsep}{os.environ['PATH']}")
    result = subprocess.run(["ecppack", "--help"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert "--bit" in result.stdout + result.stderr


def _nextpnr_report(tmp_path, fmax):
    # The shape of nextpnr-ecp5's --report (0.7): fmax per clock net, utilization per bel
    # type, and the critical path of each clock as steps with delays.
    step = lambda kind, source, sink, delay: {  # noqa: E731
        "type": kind, "from": {"cell": source, "port": "Q"},
        "to": {"cell": sink, "port": "A"}, "delay": delay}
    report = {
        "fmax": fmax,
        "utilization": {"TRELLIS_COMB": {"used": 100, "available": 83640},
                        "TRELLIS_FF": {"used": 50, "available": 83640},
                        "DP16KD": {"used": 4, "available": 208},
                        "MULT18X18D": {"used": 2, "available": 156}},
        "critical_paths": [
            {"from": "posedge $glbnet$crg_clkout", "to": "posedge $glbnet$crg_clkout",
             "path": [step("clk-to-q", "a", "a", 0.5), step("routing", "a", "b", 3.0),
                      step("logic", "b", "c", 0.25)]},
        ],
    }
    path = tmp_path / "nextpnr.json"
    path.write_text(json.dumps(report))
    return path


def test_report_reader(tmp_path):
    path = _nextpnr_report(tmp_path, {
        "$glbnet$crg_clkout": {"achieved": 61.234, "constraint": 50.0},
        "$glbnet$crg_clkout1": {"achieved": 400.0, "constraint": 50.0},
        "$glbnet$clk25$TRELLIS_IO_IN": {"achieved": 500.0, "constraint": 25.0},
    })
    with pytest.raises(ValueError, match="2 clocks at 50 MHz"):
        read_report(path, SYS_CLK_FREQ)
    path = _nextpnr_report(tmp_path, {
        "$glbnet$crg_clkout": {"achieved": 61.234, "constraint": 50.0},
        "$glbnet$clk25$TRELLIS_IO_IN": {"achieved": 500.0, "constraint": 25.0},
    })
    figures = read_report(path, SYS_CLK_FREQ)
    assert figures == {
        "lut4": {"used": 100, "available": 83640}, "ff": {"used": 50, "available": 83640},
        "dp16kd": {"used": 4, "available": 208}, "mult18x18d": {"used": 2, "available": 156},
        "clock": "$glbnet$crg_clkout", "fmax_mhz": 61.23, "constraint_mhz": 50.0,
        "critical_path": {"delay_ns": 3.75, "logic_ns": 0.75, "routing_ns": 3.0,
                          "from": "a", "to": "c", "through": ["b"]},
    }
