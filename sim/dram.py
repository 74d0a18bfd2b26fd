"""The simulated DRAM in the simulated hardware: :class:`HDLDram`, an AXI4 slave memory.

The memory itself is Verilog (``sim/hdl/npu_axi_dram.v``): it must load and dump its contents
with ``$readmemh``/``$writememh``, which Amaranth cannot express. This module wraps it as a
component with a signature, so that :class:`sim.bench_top.NPUBench` connects it to the NPU's
AXI4 master like any other block, and holds the figures both sides of the bench share: its
size, its latencies and the file names of its load and dump.

While a program runs no Python runs: the bench writes the program and operands into
``dram_load.hex``, raises :attr:`Command.LOAD` for a cycle, starts the NPU, sleeps until the
interrupt, raises :attr:`Command.DUMP` and reads ``dram_dump.hex`` (and ``dram_written.hex``,
the bytes written since the last :attr:`Command.CLEAR_LOG`) back. See :class:`sim.bench.Dram`.

Its size is fixed when the simulation is built: the runner builds it in the smallest of
:data:`SIZE_CLASSES` (16 MiB to the 4 GiB the NPU's addresses reach) that holds the program's
image. What the bench loads and dumps, and what the memory answers, is the image's own size
(``size``, set at run time): a beat past it is answered SLVERR whatever the class.
"""

import os
from pathlib import Path

from amaranth.hdl import ClockSignal, Instance, Module, ResetSignal
from amaranth.lib import enum, wiring
from amaranth.lib.wiring import In

from hw.axi import AXI4Signature


__all__ = ["VERILOG_SOURCE", "DRAM_BYTES", "MAX_DRAM_BYTES", "SIZE_CLASSES", "CAPACITY_ENV",
           "MAX_ENTRIES", "size_class", "capacity_from_env", "words_per_entry",
           "READ_LATENCY", "WRITE_RESPONSE_LATENCY", "FAULT_RANGES", "CHANNELS", "Command",
           "DramControlSignature", "HDLDram", "LOAD_FILE", "DUMP_FILE", "WRITTEN_FILE"]


VERILOG_SOURCE = Path(__file__).resolve().parent / "hdl" / "npu_axi_dram.v"

#: Bytes of simulated DRAM of the default build: the smallest size class.
DRAM_BYTES = 16 << 20
#: The most the NPU's 32-bit DMA addresses reach: the largest size class.
MAX_DRAM_BYTES = 1 << 32
#: The sizes the memory is built in: a Verilog memory has its size when it is built, so a
#: program's image picks the smallest class that holds it (:func:`size_class`), and each
#: class is one build per configuration and simulator (``sim/runner.py``), made once and
#: cached like any other. Four times apart: an image never sits in a memory more than four
#: times its size (a Verilator build zeroes and so touches all of its memory at start: 4.5
#: GiB for the 4 GiB class, with its write log), and the five classes are at most five
#: builds. The default build, which every test but the large-image ones uses, is the first.
SIZE_CLASSES = tuple(DRAM_BYTES << (2 * step) for step in range(5))
assert SIZE_CLASSES[-1] == MAX_DRAM_BYTES
#: The environment variable by which the runner tells the bench the size of its build.
CAPACITY_ENV = "NPU_DRAM_BYTES"
#: The most entries a Verilog memory may have: Verilator refuses 2^29 ("vector of over 1
#: billion bits"), which 4 GiB of 64-bit words would be.
MAX_ENTRIES = 1 << 28


def words_per_entry(bus_bytes, size):
    """Bus words per entry of the memory of ``size`` bytes (``RATIO`` in the Verilog): 1 but
    for the memories of more than :data:`MAX_ENTRIES` bus words (the 4 GiB class on a bus
    of 64 bits or less), whose load and dump files then have as many words a line."""
    return max(1, size // bus_bytes // MAX_ENTRIES)


def size_class(image_bytes):
    """The smallest of :data:`SIZE_CLASSES` that holds ``image_bytes``."""
    for size in SIZE_CLASSES:
        if image_bytes <= size:
            return size
    raise ValueError(f"a DRAM image of {image_bytes:,} bytes is larger than the "
                     f"{MAX_DRAM_BYTES:,} bytes a 32-bit address reaches")


def capacity_from_env():
    """Bytes of the simulated DRAM of the build this simulation runs (the runner sets
    :data:`CAPACITY_ENV`; :data:`DRAM_BYTES`, the default build's, when unset)."""
    value = os.environ.get(CAPACITY_ENV, "").strip()
    if not value:
        return DRAM_BYTES
    if not value.isdigit() or int(value) not in SIZE_CLASSES:
        raise ValueError(f"{CAPACITY_ENV} must be one of "
                         f"{', '.join(str(size) for size in SIZE_CLASSES)}, not {value!r}")
    return int(value)
#: Cycles from the cycle a read address is accepted to the cycle its first beat is valid.
READ_LATENCY = 2
#: Cycles from the cycle a burst's last write beat is accepted to the cycle its response is valid.
WRITE_RESPONSE_LATENCY = 2
#: Address ranges that can be answered SLVERR or DECERR at once.
FAULT_RANGES = 4
#: The channels back-pressure stalls, in the order of ``bp_free_max``.
CHANNELS = ("ar", "r", "aw", "w", "b")

#: Files in the simulator's working folder (the job's folder).
LOAD_FILE = "dram_load.hex"
DUMP_FILE = "dram_dump.hex"
WRITTEN_FILE = "dram_written.hex"


class Command(enum.Enum, shape=3):
    """What the DRAM does in a cycle at the bench's request (the NPU is idle meanwhile)."""
    NONE      = 0
    LOAD      = 1    #: ``$readmemh`` words ``[0, words)`` from :data:`LOAD_FILE`
    DUMP      = 2    #: ``$writememh`` them to :data:`DUMP_FILE` and the log to :data:`WRITTEN_FILE`
    CLEAR_LOG = 3    #: forget which bytes were written
    BAD_B     = 4    #: send a write response with no write outstanding (a protocol violation)


class DramControlSignature(wiring.Signature):
    """The bench's controls of :class:`HDLDram`, from the bench's side.

    Members
    -------
    command : Out(Command)
    words : Out(32)
        Bus words that a load or a dump covers, from address 0.
    size : Out(33)
        Bytes answered; a beat reaching past them is answered SLVERR.
    fault_lo, fault_hi : Out(33 * FAULT_RANGES)
        Fault range ``k`` is ``[lo, hi)``, bits ``33 k`` up.
    fault_kind : Out(4 * FAULT_RANGES)
        Per range ``{write, read, resp[1:0]}``: whether it faults writes and reads, and with
        which response.
    bp_enable : Out(1)
        Random stalls on all five channels and random extra latency.
    bp_seed : Out(32)
    bp_free_max : Out(16 * 5)
        Per channel (:data:`CHANNELS`), the longest run of free cycles between pauses.
    bp_pause_max, bp_latency_max : Out(4)
        The longest pause; the most extra cycles of a burst's latency.
    drop_writes : Out(1)
        A broken DRAM, for showing that tests catch one (a mutant): every eighth write beat
        is answered as usual but not written.
    """
    def __init__(self):
        super().__init__({
            "command":        wiring.Out(Command),
            "words":          wiring.Out(32),
            "size":           wiring.Out(33),
            "fault_lo":       wiring.Out(33 * FAULT_RANGES),
            "fault_hi":       wiring.Out(33 * FAULT_RANGES),
            "fault_kind":     wiring.Out(4 * FAULT_RANGES),
            "bp_enable":      wiring.Out(1),
            "bp_seed":        wiring.Out(32),
            "bp_free_max":    wiring.Out(16 * len(CHANNELS)),
            "bp_pause_max":   wiring.Out(4),
            "bp_latency_max": wiring.Out(4),
            "drop_writes":    wiring.Out(1),
        })


class HDLDram(wiring.Component):
    """AXI4 slave memory of ``size`` bytes (``sim/hdl/npu_axi_dram.v``), one of
    :data:`SIZE_CLASSES` in the benches.

    Parameters
    ----------
    data_width : int
        Bus width in bits.
    addr_width : int
    size : int
        Bytes of memory, a multiple of the bus width (:data:`DRAM_BYTES` by default), at
        most :data:`MAX_DRAM_BYTES`.
    read_latency, write_response_latency : int
        See :data:`READ_LATENCY` and :data:`WRITE_RESPONSE_LATENCY` (at least 2).

    Members
    -------
    bus : In(AXI4Signature)
        The slave port.
    control : In(DramControlSignature)
        The bench's controls.
    """
    def __init__(self, *, data_width, addr_width=32, size=DRAM_BYTES,
                 read_latency=READ_LATENCY, write_response_latency=WRITE_RESPONSE_LATENCY):
        if size <= 0 or size % (data_width // 8) or size > MAX_DRAM_BYTES:
            raise ValueError(f"size must be a positive multiple of {data_width // 8} bytes, "
                             f"at most {MAX_DRAM_BYTES}, not {size!r}")
        for name, value in (("read_latency", read_latency),
                            ("write_response_latency", write_response_latency)):
            if not isinstance(value, int) or value < 2:
                raise ValueError(f"{name} must be an integer of at least 2, not {value!r}")
        self.data_width = data_width
        self.addr_width = addr_width
        self.size = size
        self.read_latency = read_latency
        self.write_response_latency = write_response_latency
        super().__init__({
            "bus":     In(AXI4Signature(addr_width=addr_width, data_width=data_width)),
            "control": In(DramControlSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        bus, control = self.bus, self.control
        m.submodules.memory = Instance(
            "npu_axi_dram",
            p_DATA_WIDTH=self.data_width,
            p_ADDR_WIDTH=self.addr_width,
            p_WORDS=self.size // (self.data_width // 8),
            p_RATIO=words_per_entry(self.data_width // 8, self.size),
            p_R_LATENCY=self.read_latency,
            p_B_LATENCY=self.write_response_latency,
            p_FAULTS=FAULT_RANGES,
            i_clk=ClockSignal("sync"), i_rst=ResetSignal("sync"),
            i_s_awid=bus.awid, i_s_awaddr=bus.awaddr, i_s_awlen=bus.awlen,
            i_s_awvalid=bus.awvalid, o_s_awready=bus.awready,
            i_s_wdata=bus.wdata, i_s_wstrb=bus.wstrb, i_s_wlast=bus.wlast,
            i_s_wvalid=bus.wvalid, o_s_wready=bus.wready,
            o_s_bid=bus.bid, o_s_bresp=bus.bresp, o_s_bvalid=bus.bvalid, i_s_bready=bus.bready,
            i_s_arid=bus.arid, i_s_araddr=bus.araddr, i_s_arlen=bus.arlen,
            i_s_arvalid=bus.arvalid, o_s_arready=bus.arready,
            o_s_rid=bus.rid, o_s_rdata=bus.rdata, o_s_rresp=bus.rresp, o_s_rlast=bus.rlast,
            o_s_rvalid=bus.rvalid, i_s_rready=bus.rready,
            i_command=control.command, i_words=control.words, i_size=control.size,
            i_fault_lo=control.fault_lo, i_fault_hi=control.fault_hi,
            i_fault_kind=control.fault_kind,
            i_bp_enable=control.bp_enable, i_bp_seed=control.bp_seed,
            i_bp_free_max=control.bp_free_max, i_bp_pause_max=control.bp_pause_max,
            i_bp_latency_max=control.bp_latency_max, i_drop_writes=control.drop_writes,
        )
        return m
