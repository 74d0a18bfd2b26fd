"""The cocotb test bench of the NPU top level: DRAM, host and clock around the DUT.

In the shape of cocotbext-axi's and taxi's benches: a :class:`TB` owns the clock, the reset
and the bus models (``AxiLiteMaster`` as the host on ``s_axil_*``; the DRAM), and the tests
are plain ``async def`` functions that use it.

The DRAM is one of two independent models with one interface, chosen by ``NPU_DRAM``:

* ``hdl`` (the default): :class:`HDLDramModel`, the AXI4 slave memory inside the simulated
  hardware (:mod:`sim.dram`). Python touches it only between programs, through files
  (``$readmemh``/``$writememh``), so while the NPU runs no Python runs at all: the clock is
  cocotb's C++ clock and the bench sleeps until the interrupt.
* ``cocotbext``: :class:`Dram`, cocotbext-axi's slave models on ``m_axi_*``, woken for every
  beat (about 50 times slower); the second opinion that ``tb/test_dram_models.py`` holds the
  first to.

Three things every test gets for free:

* the AXI4 protocol checker built into the simulated top level (:mod:`sim.axi_checker`) is
  watched by :class:`AxiCheck`, and its first violation fails the test with a clear message;
* with ``NPU_BACKPRESSURE=<seed>`` in the environment, :class:`Backpressure` stalls all five
  AXI4 channels of the DRAM and all five AXI4-Lite channels of the host at random, and the
  DRAM answers with random extra latency; results must stay bit-exact;
* the DRAM answers a beat outside its size SLVERR, can be told to answer chosen addresses
  SLVERR or DECERR (``inject_fault``), and can log the bytes written (``record_writes``).
"""

import logging
import os
import random
import re
from pathlib import Path

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import (ClockCycles, FallingEdge, ReadOnly, RisingEdge, SimTimeoutError,
                             with_timeout)
from cocotbext.axi import (AxiBus, AxiLiteBus, AxiLiteMaster, AxiResp, AxiSlaveRead,
                           AxiSlaveWrite)
from cocotbext.axi.memory import Memory

from hw.config import NPUConfig
from hw.isa import MAGIC, PERF_COUNTERS, Control, ErrorCode, Reg, Status
from . import dram as hdl_dram
from .axi_checker import RULE_TEXT, Rule
from .bench_top import CLOCK_NS, DRAM_MODELS, backpressure_from_env, dram_from_env


__all__ = ["TB", "Dram", "HDLDramModel", "AxiCheck", "Backpressure", "ProgramOutcome",
           "ProgramHang", "DRAM_MODELS", "config_from_env", "backpressure_from_env",
           "dram_from_env"]

#: The poison a faulted read beat carries instead of data.
FAULT_POISON = 0xEE


def config_from_env():
    """The :class:`NPUConfig` the runner built this simulation for."""
    return NPUConfig.from_json(os.environ["NPU_CONFIG"])


class Backpressure:
    """Random stalls and latency for the bus models, all drawn from one seed.

    Each channel gets its own pattern: runs of up to ``max_pause`` stalled cycles between
    runs of free ones, with a share of stalled cycles between 10% and 60% chosen per channel.
    Bounded runs keep the worst case finite, so a program's cycle count stays bounded too.

    Parameters
    ----------
    seed : int
    max_pause : int
        Longest run of cycles a channel stays paused.
    max_latency : int
        Longest extra delay before a DRAM read beat or write is carried out.
    """
    def __init__(self, seed, *, max_pause=6, max_latency=12):
        self.seed = seed
        self.max_pause = max_pause
        self.max_latency = max_latency
        self._latency_rng = random.Random(f"{seed}/latency")

    def _shares(self, channel):
        rng = random.Random(f"{self.seed}/{channel}")
        stalled_share = rng.uniform(0.1, 0.6)
        mean_pause = (1 + self.max_pause) / 2
        mean_free = mean_pause * (1 - stalled_share) / stalled_share
        return rng, max(1, int(2 * mean_free))

    def pauses(self, channel):
        """An endless pause generator for ``channel`` (a name: the seed of its pattern)."""
        rng, free_max = self._shares(channel)
        while True:
            # At least one free cycle between pauses, so no stall lasts past max_pause.
            for _ in range(rng.randint(1, free_max)):
                yield False
            for _ in range(rng.randint(1, self.max_pause)):
                yield True

    def latency(self):
        """Extra cycles before the DRAM carries out an access: none three times out of four."""
        if self._latency_rng.random() < 0.75:
            return 0
        return self._latency_rng.randint(1, self.max_latency)

    def host_channels(self, host):
        """The pause generators of the AXI4-Lite ``host``'s five channels, by channel."""
        channels = {
            "host.aw": host.write_if.aw_channel, "host.w": host.write_if.w_channel,
            "host.b": host.write_if.b_channel, "host.ar": host.read_if.ar_channel,
            "host.r": host.read_if.r_channel,
        }
        return {channel: self.pauses(name) for name, channel in channels.items()}

    def apply(self, dram):
        """Stall all five AXI4 channels of ``dram`` and add latency to its accesses.

        On :class:`HDLDramModel` the same kind of pattern (the shares of stalled cycles drawn
        per channel from this seed, runs of ``1..max_pause``) is made by generators in the
        hardware; on :class:`Dram` by cocotbext-axi's pause generators, one coroutine a
        channel.
        """
        if isinstance(dram, HDLDramModel):
            dram.set_backpressure(
                seed=random.Random(f"{self.seed}/dram").getrandbits(32),
                free_max=[self._shares(f"dram.{name}")[1] for name in hdl_dram.CHANNELS],
                pause_max=self.max_pause, latency_max=self.max_latency)
            return
        dram.latency = self.latency
        channels = {
            "dram.aw": dram.write_if.aw_channel, "dram.w": dram.write_if.w_channel,
            "dram.b": dram.write_if.b_channel, "dram.ar": dram.read_if.ar_channel,
            "dram.r": dram.read_if.r_channel,
        }
        for name, channel in channels.items():
            channel.set_pause_generator(self.pauses(name))


def _overlaps(ranges, address, length):
    for start, end, resp in ranges:
        if address < end and start < address + length:
            return resp
    return None


class _DramRead(AxiSlaveRead):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The library answers a beat whose read raises SLVERR; a fault chosen by the test may
        # also be DECERR, so the response of the beat being sent is set here.
        self._beat_resp = None
        send = self.r_channel.send

        async def send_with_resp(beat):
            if self._beat_resp is not None:
                beat.rresp = self._beat_resp
                self._beat_resp = None
            await send(beat)
        self.r_channel.send = send_with_resp

    async def _read(self, address, length):
        dram = self.target
        delay = dram.latency()
        if delay:
            await ClockCycles(self.clock, delay)
        if address + length > dram.size:
            # cocotbext-axi answers SLVERR for a beat whose read raises.
            raise IndexError(f"read of {length} bytes at {address:#x} is outside DRAM")
        resp = _overlaps(dram.read_faults, address, length)
        if resp is not None:
            self._beat_resp = resp
            return bytes([FAULT_POISON]) * length
        return dram.read(address, length)


class _DramWrite(AxiSlaveWrite):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._burst_resp = None
        send = self.b_channel.send

        async def send_with_resp(response):
            if self._burst_resp is not None:
                response.bresp = self._burst_resp
                self._burst_resp = None
            await send(response)
        self.b_channel.send = send_with_resp

    async def _write(self, address, data):
        dram = self.target
        delay = dram.latency()
        if delay:
            await ClockCycles(self.clock, delay)
        if address + len(data) > dram.size:
            raise IndexError(f"write of {len(data)} bytes at {address:#x} is outside DRAM")
        resp = _overlaps(dram.write_faults, address, len(data))
        if resp is not None:
            self._burst_resp = resp
            return
        if dram.writes is not None:
            dram.writes.append((address, len(data)))
        dram.write(address, data)


class Dram(Memory):
    """DRAM behind an AXI4 slave: cocotbext-axi's slave models over a :class:`Memory`.

    Unlike ``AxiRam``, which wraps addresses around its size, a beat outside the DRAM is
    answered SLVERR, as a real interconnect answers an unmapped address with an error.

    Attributes
    ----------
    read_faults, write_faults : list of ``(start, end, AxiResp)``
        Byte ranges ``[start, end)``: a read beat that touches one is answered with that
        response (and carries poison instead of data); a write beat that touches one is not
        written, and its burst is answered with that response.
    writes : list of ``(address, length)`` or None
        Every write carried out, in order, once :meth:`record_writes` was called.
    latency : callable
        Extra cycles before each access (none unless back-pressure is on).
    """
    def __init__(self, bus, clock, reset, size):
        super().__init__(size)
        self.read_faults = []
        self.write_faults = []
        self.writes = None
        self.latency = lambda: 0
        self.write_if = _DramWrite(bus.write, clock, reset, target=self)
        self.read_if = _DramRead(bus.read, clock, reset, target=self)

    def inject_fault(self, start, end, *, read=False, write=False, resp=AxiResp.SLVERR):
        """Answer reads and/or writes that touch ``[start, end)`` with ``resp``."""
        resp = AxiResp(resp)
        if resp not in (AxiResp.SLVERR, AxiResp.DECERR):
            raise ValueError(f"resp must be SLVERR or DECERR, not {resp!r}")
        if not read and not write:
            raise ValueError("inject_fault needs read=True, write=True or both")
        if read:
            self.read_faults.append((start, end, resp))
        if write:
            self.write_faults.append((start, end, resp))

    def clear_faults(self):
        self.read_faults.clear()
        self.write_faults.clear()

    def record_writes(self):
        """Start (or restart) the log of writes in :attr:`writes`."""
        self.writes = []

    async def flush(self):
        """Nothing to do: the model answers from :attr:`mem` itself (see :class:`HDLDramModel`)."""

    async def send_bad_write_response(self):
        """Send a write response with no write outstanding (a protocol violation)."""
        response = self.write_if.b_channel._transaction_obj()
        response.bid, response.bresp = 0, AxiResp.OKAY
        await self.write_if.b_channel.send(response)

    async def fetch(self):
        """Nothing to do: writes land in :attr:`mem` as they happen."""


class HDLDramModel:
    """The DRAM in the simulated hardware (:class:`sim.dram.HDLDram`), from the bench's side.

    It has :class:`Dram`'s interface. The bench keeps a copy of the memory in Python
    (:attr:`image`, the first :attr:`size` bytes): :meth:`write` and :meth:`read` work on the
    copy; :meth:`flush` hands a changed copy to the hardware in one ``$readmemh`` (and sets its
    size and fault ranges), :meth:`fetch` takes the hardware's memory back in one
    ``$writememh``. :meth:`TB.start` flushes, :meth:`TB.outcome` fetches, so a test that reads
    the DRAM while a program runs fetches first.

    Parameters
    ----------
    dut : the simulated top level
    size : int
        Bytes answered; a beat past them is answered SLVERR (at most the size of the
        build's memory, :func:`sim.dram.capacity_from_env`).
    bus_bytes : int

    Attributes
    ----------
    writes : list of ``(address, length)`` or None
        After :meth:`record_writes`: the runs of bytes written since, in address order (read
        it after :meth:`fetch`). Unlike :class:`Dram`'s log of single writes, writes that
        touch are one run.
    """
    def __init__(self, dut, size, bus_bytes):
        capacity = hdl_dram.capacity_from_env()
        if not 0 < size <= capacity:
            raise ValueError(f"the simulated DRAM of this build holds {capacity:,} bytes; a "
                             f"bench of {size:,} bytes does not fit (sim.runner.build's "
                             f"dram_bytes picks a larger one)")
        self.dut = dut
        self.size = size
        self.bus_bytes = bus_bytes
        self.words = -(-size // bus_bytes)
        # A line of the load and dump files: one memory entry (sim.dram.words_per_entry).
        self.entry_bytes = hdl_dram.words_per_entry(bus_bytes, capacity) * bus_bytes
        self.image = np.zeros(-(-size // self.entry_bytes) * self.entry_bytes, dtype=np.uint8)
        self.read_faults = []
        self.write_faults = []
        self._log = None                     # the written bytes' mask, once recorded
        self._clear_log = False
        self._dirty = True                   # the copy differs from the hardware's memory
        self._faults_dirty = True
        control = {
            "command": hdl_dram.Command.NONE.value, "words": self.words,
            "size": size, "fault_lo": 0, "fault_hi": 0, "fault_kind": 0, "bp_enable": 0,
            "bp_seed": 0, "bp_free_max": 0, "bp_pause_max": 0, "bp_latency_max": 0,
            "drop_writes": 0,
        }
        for name, value in control.items():
            getattr(dut, f"dram_{name}").value = value

    def drop_writes(self):
        """Break the DRAM: from now on every eighth write beat is lost (a mutant)."""
        self.dut.dram_drop_writes.value = 1

    async def send_bad_write_response(self):
        """Send a write response with no write outstanding (a protocol violation)."""
        await self._command(hdl_dram.Command.BAD_B)

    def set_backpressure(self, *, seed, free_max, pause_max, latency_max):
        """Turn on the hardware's stall and latency generators (before the reset)."""
        dut = self.dut
        dut.dram_bp_enable.value = 1
        dut.dram_bp_seed.value = seed
        dut.dram_bp_free_max.value = sum(min(value, 0xFFFF) << (16 * index)
                                         for index, value in enumerate(free_max))
        dut.dram_bp_pause_max.value = pause_max
        dut.dram_bp_latency_max.value = min(latency_max, 15)

    def write(self, address, data):
        data = np.frombuffer(bytes(data), dtype=np.uint8)
        if address < 0 or address + len(data) > self.size:
            raise IndexError(f"write of {len(data)} bytes at {address:#x} is outside the "
                             f"DRAM's {self.size} bytes")
        self.image[address:address + len(data)] = data
        self._dirty = True

    def read(self, address, length):
        if address < 0 or address + length > self.size:
            raise IndexError(f"read of {length} bytes at {address:#x} is outside the "
                             f"DRAM's {self.size} bytes")
        return self.image[address:address + length].tobytes()

    def inject_fault(self, start, end, *, read=False, write=False, resp=AxiResp.SLVERR):
        """Answer reads and/or writes that touch ``[start, end)`` with ``resp``."""
        resp = AxiResp(resp)
        if resp not in (AxiResp.SLVERR, AxiResp.DECERR):
            raise ValueError(f"resp must be SLVERR or DECERR, not {resp!r}")
        if not read and not write:
            raise ValueError("inject_fault needs read=True, write=True or both")
        if len(self.read_faults) + len(self.write_faults) >= hdl_dram.FAULT_RANGES:
            raise ValueError(f"the simulated DRAM answers at most {hdl_dram.FAULT_RANGES} "
                             f"fault ranges at once")
        if read:
            self.read_faults.append((start, end, resp))
        if write:
            self.write_faults.append((start, end, resp))
        self._faults_dirty = True

    def clear_faults(self):
        self.read_faults.clear()
        self.write_faults.clear()
        self._faults_dirty = True

    def record_writes(self):
        """Start (or restart) the log of written bytes in :attr:`writes`."""
        self._log = np.zeros(len(self.image), dtype=bool)
        self._clear_log = True

    @property
    def writes(self):
        if self._log is None:
            return None
        edges = np.flatnonzero(np.diff(np.concatenate(([0], self._log.view(np.int8), [0]))))
        return [(int(start), int(end - start)) for start, end in zip(edges[::2], edges[1::2])]

    async def _command(self, command):
        self.dut.dram_command.value = command.value
        await RisingEdge(self.dut.clk)
        self.dut.dram_command.value = hdl_dram.Command.NONE.value
        # The command ran at that edge; the files are complete half a cycle later.
        await FallingEdge(self.dut.clk)

    async def flush(self):
        """Hand the copy, the fault ranges and a fresh write log to the hardware if they
        changed (the NPU must be idle)."""
        if self._faults_dirty:
            lo = hi = kind = 0
            faults = ([(s, e, r, 0b01) for s, e, r in self.read_faults]
                      + [(s, e, r, 0b10) for s, e, r in self.write_faults])
            for index, (start, end, resp, which) in enumerate(faults):
                lo |= start << (33 * index)
                hi |= end << (33 * index)
                kind |= (which << 2 | int(resp)) << (4 * index)
            self.dut.dram_fault_lo.value = lo
            self.dut.dram_fault_hi.value = hi
            self.dut.dram_fault_kind.value = kind
            self._faults_dirty = False
        if self._dirty:
            _write_memh(hdl_dram.LOAD_FILE, self.image, self.entry_bytes)
            await self._command(hdl_dram.Command.LOAD)
            self._dirty = False
        if self._clear_log:
            await self._command(hdl_dram.Command.CLEAR_LOG)
            self._clear_log = False

    async def fetch(self):
        """Take the hardware's memory (and write log) back into the copy."""
        await self._command(hdl_dram.Command.DUMP)
        self.image[:] = _read_memh(hdl_dram.DUMP_FILE, self.entry_bytes).reshape(-1)
        if self._log is not None:
            self._log = _read_written(hdl_dram.WRITTEN_FILE, self.entry_bytes)


#: Bus words converted at once to or from hex text: a large image (up to 4 GiB) is written
#: and read in pieces, so that its text is never held whole.
_MEMH_CHUNK_WORDS = 1 << 20
#: The value of each hex digit's character, 255 for any other character.
_HEX_DIGIT = np.full(256, 255, dtype=np.uint8)
for _value, _digit in enumerate(b"0123456789abcdef"):
    _HEX_DIGIT[_digit] = _HEX_DIGIT[ord(chr(_digit).upper())] = _value
_MEMH_COMMENT = re.compile(rb"[ \t]*//[^\n]*\n")


def _write_memh(path, image, bus_bytes):
    """Write ``image`` (``uint8``) as ``$readmemh`` text: one bus word per line, most
    significant byte first."""
    words = image.reshape(-1, bus_bytes)[:, ::-1]
    with open(path, "w") as file:
        for start in range(0, len(words), _MEMH_CHUNK_WORDS):
            file.write(words[start:start + _MEMH_CHUNK_WORDS].tobytes().hex("\n", bus_bytes)
                       + "\n")


def _memh_lines(path):
    """The words of a ``$writememh`` file, in hex (Icarus puts address comments between)."""
    return [line.strip() for line in Path(path).read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("//")]


def _read_written(path, bus_bytes):
    """The DRAM's write log (``$writememh`` of a mask per word, bit ``i`` for byte ``i``) as one
    ``bool`` per byte. A mask is read as bytes, not as a machine integer: it is 64 bits wide on
    a 512-bit bus."""
    masks = _read_memh(path, -(-bus_bytes // 8))
    return np.unpackbits(masks, axis=1, bitorder="little")[:, :bus_bytes].astype(bool).reshape(-1)


def _read_memh(path, width_bytes):
    """The words of a ``$writememh`` file as ``uint8`` rows, least significant byte first.

    Both simulators write every word in full, one per line, Icarus with an address comment
    every 16 lines: such a file is decoded with numpy (Verilator's read in pieces, so that a
    large DRAM's text is never held whole); any other (a short line, a digit that is ``x``)
    line by line."""
    digits = 2 * width_bytes
    line = digits + 1
    size = os.path.getsize(path)
    if size and size % line == 0:
        with open(path, "rb") as file:
            words = _decode_memh(iter(lambda: file.read(_MEMH_CHUNK_WORDS * line), b""),
                                 size // line, width_bytes)
        if words is not None:
            return words
    data = Path(path).read_bytes()
    if b"/" in data:
        data = _MEMH_COMMENT.sub(b"", data)
    if data and len(data) % line == 0:
        pieces = (data[start:start + _MEMH_CHUNK_WORDS * line]
                  for start in range(0, len(data), _MEMH_CHUNK_WORDS * line))
        words = _decode_memh(pieces, len(data) // line, width_bytes)
        if words is not None:
            return words
    lines = _memh_lines(path)
    text = "".join(line.rjust(digits, "0") if len(line) != digits else line for line in lines)
    return np.frombuffer(bytes.fromhex(text), dtype=np.uint8).reshape(-1, width_bytes)[:, ::-1]


def _decode_memh(pieces, count, width_bytes):
    """``count`` words of ``width_bytes`` from ``pieces`` of whole lines of hex text, or
    ``None`` if a line is not ``2 * width_bytes`` hex digits."""
    digits = 2 * width_bytes
    words = np.empty((count, width_bytes), dtype=np.uint8)
    start = 0
    for piece in pieces:
        rows = np.frombuffer(piece, dtype=np.uint8).reshape(-1, digits + 1)
        values = _HEX_DIGIT[rows[:, :digits]]
        if (rows[:, digits] != ord("\n")).any() or (values == 255).any():
            return None
        words[start:start + len(rows)] = values[:, 0::2] << 4 | values[:, 1::2]
        start += len(rows)
    return words[:, ::-1] if start == count else None


class AxiCheck:
    """The report of the AXI4 protocol checker in the simulated top level.

    A task sleeps on ``axi_check_error`` and fails the test with the checker's first
    violation; :meth:`assert_clean` checks the same at a point of the test's choosing.
    """
    def __init__(self, dut):
        self.dut = dut
        self._task = cocotb.start_soon(self._watch())

    def _reported(self):
        # Before the first reset Icarus holds the report at X: that is no violation.
        value = self.dut.axi_check_error.value
        return value.is_resolvable and int(value) == 1

    def violation(self):
        """The checker's first violation as a sentence, or ``None``."""
        if not self._reported():
            return None
        rule = Rule(int(self.dut.axi_check_rule.value))
        addr = int(self.dut.axi_check_addr.value)
        cycle = int(self.dut.axi_check_cycle.value)
        return (f"AXI4 protocol violation on m_axi, {rule.name}: {RULE_TEXT[rule]} "
                f"(burst address {addr:#010x}, cycle {cycle} after reset, "
                f"{cycle * CLOCK_NS} ns; WAVES=1 writes the waveform)")

    def assert_clean(self):
        message = self.violation()
        assert message is None, message

    def stop(self):
        """Stop failing the test on a violation (for tests that provoke one)."""
        self._task.cancel()

    async def wait_violation(self, timeout_cycles=None):
        """Sleep until the checker reports a violation; return its sentence.

        Returns in the read-only phase of that time step (the report's other signals settle
        with ``axi_check_error``), so the caller awaits a clock edge before driving anything.
        """
        while not self._reported():
            edge = RisingEdge(self.dut.axi_check_error)
            if timeout_cycles is None:
                await edge
            else:
                await with_timeout(edge, timeout_cycles * CLOCK_NS, "ns")
            await ReadOnly()
        return self.violation()

    async def _watch(self):
        raise AssertionError(await self.wait_violation())


class ProgramOutcome:
    """Status registers read back after a program ended."""
    def __init__(self, status, error_pc, pc, cycles, perf=None):
        self.perf = perf
        self.status = status
        self.done = bool(status & Status.DONE)
        self.error = bool(status & Status.ERROR)
        self.error_code = ErrorCode((status >> Status.CODE_SHIFT) & 0xFF)
        self.error_pc = error_pc
        self.pc = pc
        self.cycles = cycles

    @property
    def instructions(self):
        """Instructions completed: through END when done, before the failing one otherwise."""
        return self.pc + 1 if self.done else self.error_pc

    def __repr__(self):
        return (f"ProgramOutcome(done={self.done}, error={self.error_code.name}, "
                f"error_pc={self.error_pc}, cycles={self.cycles})")


class ProgramHang(AssertionError):
    """A program did not raise the interrupt within its bound of cycles."""


class TB:
    """Clock, reset, DRAM and host around the NPU top level.

    Parameters
    ----------
    dut : cocotb handle of the simulated top level (``sim.runner.TOPLEVEL``)
    dram_size : int
        Bytes of DRAM behind the AXI4 master; accesses beyond it are answered SLVERR.
    backpressure : int, optional
        Seed of :class:`Backpressure`; by default ``NPU_BACKPRESSURE`` (unset: none).
    """
    def __init__(self, dut, dram_size, *, backpressure=None, dram_model=None):
        self.dut = dut
        self.config = config_from_env()
        self.log = logging.getLogger("cocotb.tb")
        self.log.setLevel(logging.INFO)
        # Icarus leaves undriven inputs at Z; every input is driven from time zero.
        dut.rst.value = 1
        # Under Verilator the main loop toggles the clock (sim/verilator/main.cpp); elsewhere
        # cocotb's C++ clock: a Python clock would wake the interpreter twice a cycle.
        self.clock = None
        if not os.environ.get("NPU_CLOCK_HALF_STEPS"):
            self.clock = Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi")
            # Low first: a rising edge at time 0 would come before Icarus has settled the
            # design's initial values.
            self.clock.start(start_high=False)
        self.dram_model = dram_model or dram_from_env()
        if self.dram_model == "hdl":
            self.dram = HDLDramModel(dut, dram_size, self.config.bus_bytes)
        else:
            self.dram = Dram(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst,
                             size=dram_size)
        # No reset for the host model: the bench resets the NPU once, before the first access,
        # and a model watching `rst` costs a value-change check every cycle.
        self.host = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axil"), dut.clk)
        # The models log every burst at INFO and every faulted beat as a warning: thousands
        # of GEMMs and random programs would fill the log and slow the simulation down.
        models = [self.host.write_if, self.host.read_if]
        if isinstance(self.dram, Dram):
            models += [self.dram.write_if, self.dram.read_if]
        for model in models:
            model.log.setLevel(logging.ERROR)
        if backpressure is None:
            backpressure = backpressure_from_env()
        self.backpressure = None
        self._host_pauses = {}
        if backpressure is not None:
            self.backpressure = Backpressure(backpressure)
            self.backpressure.apply(self.dram)
            self._host_pauses = self.backpressure.host_channels(self.host)
            self._pause_host(True)
            self.log.info("back-pressure on, seed %d, %s DRAM", backpressure, self.dram_model)
        mutant = os.environ.get("NPU_MUTANT", "").strip()
        dut.axi_check_disable.value = 0
        dut.bench_sleep.value = 0
        #: Whether :meth:`wait_irq` lets Verilator run the clock without waking cocotb
        #: (``bench_sleep``, :class:`sim.bench_top.NPUBench`): only with the HDL DRAM, where
        #: no Python model waits for the bus. A test that keeps a coroutine of its own
        #: waiting for a signal while it waits for the interrupt sets it to ``False``.
        self.sleeps = isinstance(self.dram, HDLDramModel)
        if mutant == "drop_writes" and isinstance(self.dram, HDLDramModel):
            self.dram.drop_writes()
        elif mutant.startswith("checker_without_"):
            rule = Rule[mutant.removeprefix("checker_without_")]
            dut.axi_check_disable.value = 1 << rule.value
        elif mutant:
            raise ValueError(f"NPU_MUTANT must be drop_writes (HDL DRAM only) or "
                             f"checker_without_<RULE>, not {mutant!r}")
        if mutant:
            self.log.warning("mutant: %s", mutant)
        self.axi_check = AxiCheck(dut)

    def _pause_host(self, on):
        """Run the host's pause generators (``on``) or hold them where they are: each is a
        coroutine woken every cycle, so they sleep while the bench waits for the NPU."""
        for channel, pauses in self._host_pauses.items():
            channel.set_pause_generator(pauses if on else None)
            if not on:
                channel.pause = False

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 2)
        magic = await self.host.read_dword(Reg.MAGIC)
        assert magic == MAGIC, f"MAGIC reads {magic:#x}, expected {MAGIC:#x}"

    async def read_reg(self, reg):
        return await self.host.read_dword(reg)

    async def write_reg(self, reg, value):
        await self.host.write_dword(reg, value)

    async def start(self, prog_addr, prog_len):
        """Hand the DRAM's contents to its model and start the program."""
        await self.dram.flush()
        await self.write_reg(Reg.PROG_ADDR, prog_addr)
        await self.write_reg(Reg.PROG_LEN, prog_len)
        await self.write_reg(Reg.CONTROL, Control.START)

    async def wait_irq(self, timeout_cycles):
        """Sleep until the interrupt; Python does nothing while the hardware runs.

        Raises :class:`ProgramHang`, with STATUS and PC, if it does not come within
        ``timeout_cycles``.
        """
        if self.dut.irq.value:
            return
        self._pause_host(False)
        self.dut.bench_sleep.value = int(self.sleeps)
        try:
            await with_timeout(RisingEdge(self.dut.irq), timeout_cycles * CLOCK_NS, "ns")
        except SimTimeoutError:
            self.dut.bench_sleep.value = 0
            self._pause_host(True)
            status = await self.read_reg(Reg.STATUS)
            pc = await self.read_reg(Reg.PC)
            raise ProgramHang(f"no interrupt within {timeout_cycles} cycles: STATUS "
                              f"{status:#x}, PC {pc}") from None
        self.dut.bench_sleep.value = 0
        self._pause_host(True)

    async def outcome(self):
        """The status registers after a program ended; the DRAM's model holds its contents
        again (:meth:`HDLDramModel.fetch`)."""
        await self.dram.fetch()
        status = await self.read_reg(Reg.STATUS)
        error_pc = await self.read_reg(Reg.ERROR_PC)
        pc = await self.read_reg(Reg.PC)
        cycles = await self.read_reg(Reg.CYCLES_LO)
        cycles |= (await self.read_reg(Reg.CYCLES_HI)) << 32
        perf = {name: await self.read_reg(reg) for name, reg in PERF_COUNTERS.items()}
        perf["cycles"] = cycles
        self.axi_check.assert_clean()
        return ProgramOutcome(status, error_pc, pc, cycles, perf)

    async def run_program(self, prog_addr, prog_len, timeout_cycles=10_000_000):
        await self.start(prog_addr, prog_len)
        await self.wait_irq(timeout_cycles)
        outcome = await self.outcome()
        self.log.info("program at %#x: %r", prog_addr, outcome)
        return outcome
