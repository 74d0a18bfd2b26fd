"""Simulating the gateware in Amaranth's simulator: running a simulation, an AXI4 slave
memory model, an AXI4-Lite master, and programs on the whole NPU (:func:`run_jobs`).

The unit tests of every block use these, and so does ``npu bench`` for the Amaranth
simulator's speed. Waveforms are written only when the environment has ``WAVES=1``, to
``build/waves/``. Every bus model here decides a handshake from the values sampled *at* the
clock edge (``ctx.tick().sample(...)``), so it does not matter in which order testbenches run
between two edges.
"""

import os
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from amaranth.sim import Simulator

from hw.axi import Burst, Resp
from hw.config import NPUConfig
from hw.isa import INSTR_BYTES, Control, ErrorCode, Reg, Status


__all__ = ["run_simulation", "wrap32", "AXI4MemoryModel", "axil_read", "axil_write", "Job",
           "Outcome", "run_jobs"]


WAVES_DIR = Path(__file__).resolve().parent.parent / "build" / "waves"
_waves_written = set()


def _waves_path(vcd_name, dut):
    """``build/waves/<name>.vcd``, named after the running pytest test unless ``vcd_name``
    is given; a second simulation in the same test gets ``_2``, and so on."""
    if vcd_name is None:
        test = os.environ.get("PYTEST_CURRENT_TEST", type(dut).__name__).split(" ")[0]
        vcd_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", test.rsplit("/", 1)[-1]).strip("_")
    name, count = vcd_name, 1
    while name in _waves_written:
        count += 1
        name = f"{vcd_name}_{count}"
    _waves_written.add(name)
    return WAVES_DIR / f"{name}.vcd"


def run_simulation(dut, *testbenches, processes=(), vcd_name=None):
    """Simulate ``dut`` with a 1 MHz ``sync`` clock until every testbench has returned.

    ``processes`` are background async processes (bus models) that run as long as the
    testbenches do. An exception in any of them fails the simulation. With ``WAVES=1`` in
    the environment the waveforms go to ``build/waves/`` (see :func:`_waves_path`).
    """
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for testbench in testbenches:
        sim.add_testbench(testbench)
    for process in processes:
        sim.add_process(process)
    if os.environ.get("WAVES") == "1":
        path = _waves_path(vcd_name, dut)
        path.parent.mkdir(parents=True, exist_ok=True)
        with sim.write_vcd(str(path)):
            sim.run()
    else:
        sim.run()


def wrap32(value):
    """``value`` wrapped to a signed 32-bit integer, as an INT32 adder wraps."""
    value &= 0xFFFF_FFFF
    return value - (1 << 32) if value & 0x8000_0000 else value


class AXI4MemoryModel:
    """A byte-addressed AXI4 slave (the whole 32-bit space) for the Amaranth simulator.

    Answers AR/R and AW/W/B with random ``ready``/``valid`` stalls and a random latency
    between an accepted address and its first data beat (read) or response (write). It also
    checks what the DMA promises, raising ``AssertionError`` (which fails the simulation) on:
    a burst that is not INCR, not full-width, not bus-aligned, longer than 256 beats or across
    a 4 KiB boundary; a ``valid`` that drops or a payload that changes before its handshake;
    W data before its AW was accepted; ``wlast`` anywhere but on the last beat of a burst.

    Bytes never written read as a fixed pseudo-random function of their address.

    Parameters
    ----------
    bus : the DUT's AXI4 manager interface (``AXI4Signature`` members).
    data_width : int
    seed : int
        Seed of the stall and latency choices; tests put it in their assertion messages.
    ready_probability : float
        Chance that a ``ready`` or a new ``rvalid``/``bvalid`` is offered in a cycle.
    max_latency : int
        Largest number of cycles between an address and its first data beat or response.
    read_errors, write_errors : sequence of ``(start, end, Resp)``
        Byte ranges ``[start, end)``: a read beat or write burst that touches one is answered
        with that response (and an erroneous write burst leaves memory unchanged).
    misframed_reads : sequence of ``(start, end, kind)``
        A broken slave: a read burst whose address lies in ``[start, end)`` is answered with
        the wrong framing, by ``kind`` (:data:`MISFRAMINGS`): ``"short"``, a beat fewer than
        asked, ``rlast`` on the last one sent (bursts of two beats or more); ``"long"``, a
        beat more, ``rlast`` on the extra one; ``"no_rlast"``, the beats asked, none with
        ``rlast``.
    read_latency : int
        Cycles added to every read burst's latency (on top of the random ``max_latency``).

    Attributes
    ----------
    hold_reads : bool
        While true, no R beat is offered (addresses are still accepted).
    hold_responses : bool
        While true, no write response is offered (bursts are still accepted).
    silent_reads, silent_writes : list of ``(start, end)``
        A slave that does not answer (for the bus watchdog): an AR (``silent_reads``) or AW
        (``silent_writes``) whose address lies in ``[start, end)`` never gets its ``ready``,
        and the master is not held to keep it ``valid`` (it may abandon it). With
        ``hold_reads``, :meth:`forget` and these, a test makes every way a slave can stop
        answering.
    """
    #: The ways ``misframed_reads`` breaks a burst.
    MISFRAMINGS = ("short", "long", "no_rlast")

    def __init__(self, bus, *, data_width, seed, ready_probability=0.7, max_latency=4,
                 read_errors=(), write_errors=(), misframed_reads=(), read_latency=0):
        self.bus = bus
        self.bus_bytes = data_width // 8
        self.seed = seed
        print(f"AXI4MemoryModel: seed {seed}")   # shown by pytest when a test fails
        self.rng = np.random.default_rng(seed)
        self.ready_probability = ready_probability
        self.max_latency = max_latency
        self.read_errors = list(read_errors)
        self.write_errors = list(write_errors)
        for _, _, kind in misframed_reads:
            if kind not in self.MISFRAMINGS:
                raise ValueError(f"a misframed read must be one of {', '.join(self.MISFRAMINGS)}, "
                                 f"not {kind!r}")
        self.misframed_reads = list(misframed_reads)
        self.read_latency = read_latency
        self.hold_reads = False
        self.hold_responses = False
        self.silent_reads = []
        self.silent_writes = []
        self._forget = False
        self.memory = {}
        #: Every byte the DUT wrote, address -> last value.
        self.written = {}
        #: ``(addr, beats)`` of every accepted read and write burst.
        self.read_bursts = []
        self.write_bursts = []
        # Accepted read bursts: [addr, beats, next_beat, ready_cycle, beats_sent, rlast_beat].
        self._ar = deque()
        self._aw = deque()   # accepted write bursts awaiting data: [addr, beats, next_beat, resp]
        self._b = deque()    # write responses: [resp, ready_cycle]
        self._spurious_b = 0  # write responses to send that no burst asked for

    # ------------------------------------------------------------------ memory contents
    @staticmethod
    def background(addr):
        """The value of a byte that was never written."""
        return ((addr * 0x9E3779B1) >> 11) & 0xFF

    def load(self, addr, data):
        """Put ``data`` (bytes) at ``addr`` without going through the bus."""
        for index, value in enumerate(bytes(data)):
            self.memory[(addr + index) & 0xFFFF_FFFF] = value

    def peek(self, addr, length):
        """``length`` bytes at ``addr``, as the bus would read them."""
        return bytes(self.memory.get((addr + index) & 0xFFFF_FFFF,
                                     self.background((addr + index) & 0xFFFF_FFFF))
                     for index in range(length))

    @property
    def idle(self):
        """No burst is waiting for data or a response."""
        return not self._ar and not self._aw and not self._b and not self._spurious_b

    def forget(self):
        """Drop every burst accepted and not finished, and any ``valid`` the master held
        without a handshake (as an interconnect reset does): after the NPU abandoned its
        transactions on a bus timeout and soft-reset. Takes effect at the next edge."""
        self._forget = True

    def send_spurious_write_response(self):
        """Send an OKAY write response that no write burst asked for (a protocol violation),
        as soon as the B channel is free."""
        self._spurious_b += 1

    def _response(self, ranges, start, length, default=Resp.OKAY):
        for lo, hi, resp in ranges:
            if start < hi and lo < start + length:
                return resp
        return default

    @staticmethod
    def _silent(ranges, addr):
        """Whether ``addr`` lies in one of ``ranges``."""
        return any(lo <= addr < hi for lo, hi in ranges)

    def _chance(self):
        return self.rng.random() < self.ready_probability

    def _latency(self):
        return int(self.rng.integers(0, self.max_latency + 1))

    # ------------------------------------------------------------------ the process
    def _check_burst(self, kind, addr, length, size, burst):
        beats = length + 1
        where = f"{kind} burst at {addr:#x} of {beats} beats (seed {self.seed})"
        assert burst == Burst.INCR.value, f"{where}: burst type {burst}, not INCR"
        assert 1 << size == self.bus_bytes, f"{where}: size {size} is not the full bus width"
        assert addr % self.bus_bytes == 0, f"{where}: not aligned to the bus width"
        assert beats <= 256, f"{where}: longer than 256 beats"
        assert addr % 4096 + beats * self.bus_bytes <= 4096, f"{where}: crosses 4 KiB"
        return beats

    async def process(self, ctx):
        bus = self.bus
        bus_bytes = self.bus_bytes
        sampled = (bus.arvalid, bus.araddr, bus.arlen, bus.arsize, bus.arburst, bus.rready,
                   bus.awvalid, bus.awaddr, bus.awlen, bus.awsize, bus.awburst,
                   bus.wvalid, bus.wdata, bus.wstrb, bus.wlast, bus.bready)
        cycle = 0
        r_beat = None       # (data, resp, last) offered on R until taken
        b_resp = None       # resp offered on B until taken
        b_spurious = False  # whether that response is one no burst asked for
        held_ar = held_aw = held_w = None   # payloads that were valid but not yet accepted
        waiting_ar = waiting_aw = None      # the same, silent addresses too
        while True:
            if self._forget:
                self._forget = False
                self._ar.clear()
                self._aw.clear()
                self._b.clear()
                r_beat = b_resp = held_ar = held_aw = held_w = waiting_ar = waiting_aw = None
            arready, awready, wready = self._chance(), self._chance(), self._chance()
            # With silent ranges, an address is answered only from the cycle after it is
            # first seen offered at an edge (this process does not see the master's valid of
            # this cycle before it decides ``ready``).
            if self.silent_reads:
                arready = arready and waiting_ar is not None and \
                    not self._silent(self.silent_reads, waiting_ar[0])
            if self.silent_writes:
                awready = awready and waiting_aw is not None and \
                    not self._silent(self.silent_writes, waiting_aw[0])
            if (r_beat is None and not self.hold_reads and self._ar and self._ar[0][3] <= cycle
                    and self._chance()):
                addr, _, beat, _, _, rlast_beat = self._ar[0]
                beat_addr = addr + beat * bus_bytes
                data = int.from_bytes(self.peek(beat_addr, bus_bytes), "little")
                resp = self._response(self.read_errors, beat_addr, bus_bytes)
                r_beat = (data, resp, beat == rlast_beat)
            if b_resp is None and self._spurious_b:
                b_resp, b_spurious = Resp.OKAY, True
            elif (b_resp is None and not self.hold_responses and self._b
                  and self._b[0][1] <= cycle and self._chance()):
                b_resp, b_spurious = self._b[0][0], False
            ctx.set(bus.arready, arready)
            ctx.set(bus.awready, awready)
            ctx.set(bus.wready, wready)
            ctx.set(bus.rvalid, r_beat is not None)
            ctx.set(bus.rdata, r_beat[0] if r_beat else 0)
            ctx.set(bus.rresp, r_beat[1].value if r_beat else 0)
            ctx.set(bus.rlast, r_beat[2] if r_beat else 0)
            ctx.set(bus.bvalid, b_resp is not None)
            ctx.set(bus.bresp, b_resp.value if b_resp is not None else 0)

            (_, _, arvalid, araddr, arlen, arsize, arburst, rready,
             awvalid, awaddr, awlen, awsize, awburst,
             wvalid, wdata, wstrb, wlast, bready) = await ctx.tick().sample(*sampled)
            cycle += 1

            # A valid that is not accepted must stay, with the same payload.
            ar_now = (araddr, arlen, arsize, arburst) if arvalid else None
            aw_now = (awaddr, awlen, awsize, awburst) if awvalid else None
            w_now = (wdata, wstrb, wlast) if wvalid else None
            for name, held, now in (("AR", held_ar, ar_now), ("AW", held_aw, aw_now),
                                    ("W", held_w, w_now)):
                assert held is None or held == now, \
                    f"{name} valid dropped or payload changed before its handshake: " \
                    f"{held} then {now} (cycle {cycle}, seed {self.seed})"

            # W data only for a burst whose address was accepted at an earlier edge.
            if wvalid:
                assert self._aw, f"W beat before its AW was accepted (cycle {cycle}, " \
                                 f"seed {self.seed})"
            if wvalid and wready:
                burst = self._aw[0]
                addr, beats, beat, resp = burst
                assert bool(wlast) == (beat == beats - 1), \
                    f"wlast={wlast} on beat {beat} of a {beats}-beat burst at {addr:#x} " \
                    f"(seed {self.seed})"
                beat_addr = addr + beat * bus_bytes
                if resp == Resp.OKAY:
                    for lane in range(bus_bytes):
                        if wstrb >> lane & 1:
                            value = wdata >> (8 * lane) & 0xFF
                            self.memory[beat_addr + lane] = value
                            self.written[beat_addr + lane] = value
                burst[2] += 1
                if burst[2] == beats:
                    self._aw.popleft()
                    self._b.append([resp, cycle + self._latency()])
            held_w = w_now if wvalid and not wready else None

            if arvalid and arready:
                beats = self._check_burst("read", araddr, arlen, arsize, arburst)
                self.read_bursts.append((araddr, beats))
                sent, rlast_beat = beats, beats - 1
                misframing = self._response(self.misframed_reads, araddr, 1, default=None)
                if misframing == "short":
                    assert beats >= 2, f"a one-beat burst at {araddr:#x} cannot be cut short"
                    sent, rlast_beat = beats - 1, beats - 2
                elif misframing == "long":
                    sent, rlast_beat = beats + 1, beats
                elif misframing == "no_rlast":
                    rlast_beat = None
                self._ar.append([araddr, beats, 0, cycle + self.read_latency + self._latency(),
                                 sent, rlast_beat])
            # A slave that does not answer does not hold the master to its valid: the master
            # may abandon it (a soft reset after its bus watchdog expired).
            waiting_ar = ar_now if arvalid and not arready else None
            held_ar = None if waiting_ar and self._silent(self.silent_reads, araddr) \
                else waiting_ar

            if awvalid and awready:
                beats = self._check_burst("write", awaddr, awlen, awsize, awburst)
                self.write_bursts.append((awaddr, beats))
                resp = self._response(self.write_errors, awaddr, beats * bus_bytes)
                self._aw.append([awaddr, beats, 0, resp])
            waiting_aw = aw_now if awvalid and not awready else None
            held_aw = None if waiting_aw and self._silent(self.silent_writes, awaddr) \
                else waiting_aw

            if r_beat is not None and rready:
                burst = self._ar[0]
                burst[2] += 1
                if burst[2] == burst[4]:
                    self._ar.popleft()
                r_beat = None
            if b_resp is not None and bready:
                if b_spurious:
                    self._spurious_b -= 1
                else:
                    self._b.popleft()
                b_resp = None


# ---------------------------------------------------------------------- AXI4-Lite master
async def axil_write(ctx, bus, addr, value, *, strobe=0xF, aw_delay=0, w_delay=0, timeout=64):
    """Write one 32-bit register through an AXI4-Lite slave port; returns ``bresp``.

    ``aw_delay`` / ``w_delay`` hold back the address or the data by that many cycles.
    """
    ctx.set(bus.bready, 1)
    aw_done = w_done = False
    for cycle in range(timeout):
        if not aw_done and cycle >= aw_delay:
            ctx.set(bus.awaddr, addr)
            ctx.set(bus.awvalid, 1)
        if not w_done and cycle >= w_delay:
            ctx.set(bus.wdata, value)
            ctx.set(bus.wstrb, strobe)
            ctx.set(bus.wvalid, 1)
        _, _, awvalid, awready, wvalid, wready = await ctx.tick().sample(
            bus.awvalid, bus.awready, bus.wvalid, bus.wready)
        if awvalid and awready:
            aw_done = True
            ctx.set(bus.awvalid, 0)
        if wvalid and wready:
            w_done = True
            ctx.set(bus.wvalid, 0)
        if aw_done and w_done:
            break
    else:
        raise AssertionError(f"AXI4-Lite write of {addr:#x} not accepted in {timeout} cycles")
    for _ in range(timeout):
        _, _, bvalid, bresp = await ctx.tick().sample(bus.bvalid, bus.bresp)
        if bvalid:
            return bresp
    raise AssertionError(f"AXI4-Lite write of {addr:#x} got no response in {timeout} cycles")


async def axil_read(ctx, bus, addr, *, timeout=64, expect_resp=Resp.OKAY):
    """Read one 32-bit register through an AXI4-Lite slave port."""
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    ctx.set(bus.rready, 1)
    for _ in range(timeout):
        _, _, arready = await ctx.tick().sample(bus.arready)
        if arready:
            break
    else:
        raise AssertionError(f"AXI4-Lite read of {addr:#x} not accepted in {timeout} cycles")
    ctx.set(bus.arvalid, 0)
    for _ in range(timeout):
        _, _, rvalid, rdata, rresp = await ctx.tick().sample(bus.rvalid, bus.rdata, bus.rresp)
        if rvalid:
            assert rresp == expect_resp.value, \
                f"AXI4-Lite read of {addr:#x} answered {Resp(rresp).name}"
            return rdata
    raise AssertionError(f"AXI4-Lite read of {addr:#x} got no data in {timeout} cycles")


# ---------------------------------------------------------------------- the whole NPU
@dataclass
class Job:
    """One program run: written to DRAM at ``prog_addr``, started, waited for."""
    words: list
    prog_addr: int
    prog_len: int = None           # default: len(words)
    data: list = field(default_factory=list)   # (addr, bytes) put in DRAM first
    soft_reset_before: bool = False
    soft_reset_after: int = None   # cycles after start: stop the program with a soft reset


@dataclass
class Outcome:
    """The host registers and the DRAM writes after one :class:`Job`."""
    status: int
    error_pc: int
    pc: int
    cycles: int
    irq: int
    written: dict   # every DRAM byte the program wrote, address -> value
    running_status: int   # STATUS read right after the start
    reset_bursts: tuple = None  # soft_reset_after: (read, write) bursts accepted after it

    @property
    def code(self):
        return ErrorCode((self.status >> Status.CODE_SHIFT) & 0xFF)


def run_jobs(jobs, *, config, seed, timeout_cycles, read_errors=(), write_errors=(),
             **timing):
    """Run ``jobs`` one after another on one :class:`hw.top.NPU` of ``config``, with
    :class:`AXI4MemoryModel` as DRAM and the host on AXI4-Lite; returns ``(outcomes, model)``.

    ``seed``, ``read_errors``, ``write_errors`` and ``timing`` (``ready_probability``,
    ``max_latency``, ``read_latency``) go to the memory model. Raises ``AssertionError`` if a
    program does not raise ``irq`` within ``timeout_cycles`` (or stay busy that long after a
    soft reset).
    """
    from hw.top import NPU

    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")
    dut = NPU(config)
    model = AXI4MemoryModel(dut.m_axi, data_width=config.bus_width, seed=seed,
                            read_errors=read_errors, write_errors=write_errors, **timing)
    outcomes = []

    async def host(ctx):
        bus = dut.s_axil
        for job in jobs:
            if job.soft_reset_before:
                await axil_write(ctx, bus, Reg.CONTROL, Control.SOFT_RESET)
                for _ in range(3):
                    await ctx.tick()
                assert ctx.get(dut.irq) == 0, "irq still high after a soft reset"
                assert await axil_read(ctx, bus, Reg.STATUS) == 0, "STATUS after soft reset"
            model.load(job.prog_addr & ~0xF,
                       b"".join(word.to_bytes(INSTR_BYTES, "little") for word in job.words))
            for addr, data in job.data:
                model.load(addr, data)
            prog_len = len(job.words) if job.prog_len is None else job.prog_len
            model.written = {}
            await axil_write(ctx, bus, Reg.PROG_ADDR, job.prog_addr)
            await axil_write(ctx, bus, Reg.PROG_LEN, prog_len)
            await axil_write(ctx, bus, Reg.CONTROL, Control.START)
            running_status = await axil_read(ctx, bus, Reg.STATUS)
            reset_bursts = None
            if job.soft_reset_after is not None:
                for _ in range(job.soft_reset_after):
                    await ctx.tick()
                await axil_write(ctx, bus, Reg.CONTROL, Control.SOFT_RESET)
                bursts_at = len(model.read_bursts), len(model.write_bursts)
                for _ in range(timeout_cycles // 8):
                    if not await axil_read(ctx, bus, Reg.STATUS) & Status.BUSY:
                        break
                else:
                    raise AssertionError(f"seed {seed}: still busy after a soft reset")
                reset_bursts = (len(model.read_bursts) - bursts_at[0],
                                len(model.write_bursts) - bursts_at[1])
            else:
                # The start edge cleared done and error, so irq now belongs to this program.
                for _ in range(timeout_cycles):
                    _, _, irq = await ctx.tick().sample(dut.irq)
                    if irq:
                        break
                else:
                    raise AssertionError(f"seed {seed}: no irq within {timeout_cycles} cycles "
                                         f"(PC {await axil_read(ctx, bus, Reg.PC)})")
            status = await axil_read(ctx, bus, Reg.STATUS)
            error_pc = await axil_read(ctx, bus, Reg.ERROR_PC)
            pc = await axil_read(ctx, bus, Reg.PC)
            cycles = await axil_read(ctx, bus, Reg.CYCLES_LO)
            cycles |= await axil_read(ctx, bus, Reg.CYCLES_HI) << 32
            # irq stays high until the next start or soft reset.
            outcomes.append(Outcome(status, error_pc, pc, cycles, ctx.get(dut.irq),
                                    dict(model.written), running_status, reset_bursts))

    run_simulation(dut, host, processes=[model.process])
    return outcomes, model
