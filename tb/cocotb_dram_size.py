"""The simulated DRAM (``sim/hdl/npu_axi_dram.v``) on its own, driven by cocotbext-axi's AXI4
master: its memory holding ``RATIO`` bus words an entry, as the 4 GiB memory of a narrow bus
does (``sim.dram.words_per_entry``), and the load and dump files the bench writes and reads
for it.

Run by ``tb/test_dram_size.py`` (``test_dram_entries``), which builds the module alone with
the parameters ``DATA_WIDTH``, ``WORDS`` and ``RATIO`` and passes them in ``DRAM_*``.
"""

import os

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, RisingEdge
from cocotbext.axi import AxiBus, AxiMaster, AxiResp

from sim import bench
from sim import dram as hdl_dram


async def command(dut, which):
    dut.command.value = which.value
    await RisingEdge(dut.clk)
    dut.command.value = hdl_dram.Command.NONE.value
    await FallingEdge(dut.clk)


@cocotb.test()
async def entries_hold_bus_words(dut):
    bus_bytes = int(os.environ["DRAM_BUS_BYTES"])
    words = int(os.environ["DRAM_WORDS"])
    ratio = int(os.environ["DRAM_RATIO"])
    entry_bytes = ratio * bus_bytes
    size = words * bus_bytes - bus_bytes          # the image: one word short of the memory
    controls = {"command": 0, "words": size // bus_bytes, "size": size, "fault_lo": 0,
                "fault_hi": 0, "fault_kind": 0, "bp_enable": 0, "bp_seed": 0,
                "bp_free_max": 0, "bp_pause_max": 0, "bp_latency_max": 0, "drop_writes": 0}
    for name, value in controls.items():
        getattr(dut, name).value = value
    dut.rst.value = 1
    Clock(dut.clk, 10, unit="ns").start(start_high=False)
    master = AxiMaster(AxiBus.from_prefix(dut, "s"), dut.clk, dut.rst)
    for model in (master.write_if, master.read_if):
        model.log.setLevel("ERROR")
    await ClockCycles(dut.clk, 3)
    dut.rst.value = 0
    await FallingEdge(dut.clk)

    rng = np.random.default_rng(words * ratio + bus_bytes)
    image = np.zeros(-(-size // entry_bytes) * entry_bytes, dtype=np.uint8)
    image[:size] = rng.integers(0, 256, size, dtype=np.uint8)
    bench._write_memh(hdl_dram.LOAD_FILE, image, entry_bytes)
    await command(dut, hdl_dram.Command.LOAD)
    await command(dut, hdl_dram.Command.CLEAR_LOG)

    # Every word reads back where the load put it, in bursts and one by one.
    assert (await master.read(0, size)).data == image[:size].tobytes()
    for word in range(size // bus_bytes):
        address = word * bus_bytes
        assert (await master.read(address, bus_bytes)).data == \
            image[address:address + bus_bytes].tobytes(), f"word {word}"

    # Writes of a few bytes in every lane of an entry, and across words.
    expected = image.copy()
    written = np.zeros(len(image), dtype=bool)
    for address, length in ((1, 2), (bus_bytes + 3, 1), (entry_bytes - 2, 5),
                            (size - 3 * bus_bytes - 1, 2 * bus_bytes)):
        data = rng.integers(0, 256, length, dtype=np.uint8)
        response = await master.write(address, data.tobytes())
        assert response.resp == AxiResp.OKAY
        expected[address:address + length] = data
        written[address:address + length] = True
    assert (await master.read(0, size)).data == expected[:size].tobytes()

    # Past the image: SLVERR, though the memory reaches one word further.
    assert (await master.read(size, bus_bytes)).resp == AxiResp.SLVERR
    assert (await master.write(size, bytes(bus_bytes))).resp == AxiResp.SLVERR

    # The dump and the write log, as the bench reads them.
    await command(dut, hdl_dram.Command.DUMP)
    dumped = bench._read_memh(hdl_dram.DUMP_FILE, entry_bytes).reshape(-1)
    assert np.array_equal(dumped, expected)
    log = bench._read_written(hdl_dram.WRITTEN_FILE, entry_bytes)
    assert np.array_equal(log, written)
