"""The cocotb test that runs driver jobs: for each program, load DRAM, run, save DRAM.

:func:`sim.runner.run_programs` writes the job to the folder named by ``NPU_JOB`` and reads
``result.json`` and ``dram_out_<i>.npy`` back from it.
"""

import json
import os
from pathlib import Path

import cocotb
import numpy as np
from cocotb.triggers import ReadOnly, RisingEdge

from .bench import TB, ProgramHang


@cocotb.test()
async def run_job(dut):
    job = Path(os.environ["NPU_JOB"])
    spec = json.loads((job / "job.json").read_text())
    images = [np.load(job / f"dram_in_{index}.npy") for index in range(len(spec["programs"]))]
    dram_size = max(len(image) for image in images)

    tb = TB(dut, dram_size=dram_size)
    await tb.reset()
    trace = os.environ.get("NPU_TRACE")
    if trace:
        tb.sleeps = False  # _trace wakes in every cycle
        cocotb.start_soon(_trace(dut, Path(trace)))
    results = []
    for index, (program, image) in enumerate(zip(spec["programs"], images)):
        tb.dram.write(0, image.tobytes() + bytes(dram_size - len(image)))
        timeout = program["timeout_cycles"] or 50 * len(image) + 10_000_000
        try:
            outcome = await tb.run_program(program["prog_addr"], program["prog_len"], timeout)
        except ProgramHang as hang:
            raise ProgramHang(f"program {index} of {len(images)} (at {program['prog_addr']:#x}, "
                              f"length {program['prog_len']}): {hang}") from None
        np.save(job / f"dram_out_{index}.npy",
                np.frombuffer(tb.dram.read(0, len(image)), dtype=np.uint8))
        results.append({
            "done": outcome.done,
            "error_code": outcome.error_code.value,
            "error_pc": outcome.error_pc,
            "cycles": outcome.cycles,
            "instructions": outcome.instructions,
            "perf": outcome.perf,
        })
    (job / "result.json").write_text(json.dumps(results))


#: Signals recorded by ``NPU_TRACE=<file>``: the bus handshakes and the controller's units.
TRACE_SIGNALS = [
    "m_axi_arvalid", "m_axi_arready", "m_axi_arlen", "m_axi_rvalid", "m_axi_rready",
    "m_axi_awvalid", "m_axi_awready", "m_axi_wvalid", "m_axi_wready", "m_axi_bvalid",
    "npu.controller.pc", "npu.controller.dec_valid", "npu.controller.ld_busy",
    "npu.controller.wl_busy", "npu.controller.st_busy", "npu.controller.reader_busy",
    "npu.controller.wb_count",
    "npu.controller.store_state", "npu.dma.writer_state", "npu.controller.iq.level",
]


async def _trace(dut, path):
    """Record :data:`TRACE_SIGNALS` in every cycle the controller runs (the first program),
    one line per cycle: the controller's cycle count, then the signals, in ``path``. Under
    Verilator the internal signals are visible with ``NPU_PUBLIC=1`` only (sim/runner.py).
    It is how sw/timing.py was checked signal by signal against the RTL."""
    handles = []
    for name in TRACE_SIGNALS:
        handle = dut
        try:
            for part in name.split("."):
                handle = getattr(handle, part)
        except AttributeError:
            raise RuntimeError(f"NPU_TRACE cannot see {name}: under Verilator only the top "
                               f"level is public unless NPU_PUBLIC=1") from None
        handles.append(handle)
    running = dut.npu.controller.running
    lines = ["cycles " + " ".join(TRACE_SIGNALS)]
    started = False
    while True:
        await RisingEdge(dut.clk)
        await ReadOnly()
        if int(running.value):
            started = True
            values = [dut.npu.controller.cycles] + handles
            lines.append(" ".join(str(int(h.value)) for h in values))
        elif started:
            break
    path.write_text("\n".join(lines) + "\n")
