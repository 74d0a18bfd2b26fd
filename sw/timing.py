"""The cycle model: how many cycles a program takes on the RTL, and its performance counters.

:func:`predict` runs a program's instructions through a model of the controller's timing
(``hw/controller/``) and of the DMA engine (``hw/dma/``), one clock cycle at a time, and
returns the cycle count and the counters the hardware reports (:data:`hw.isa.PERF_COUNTERS`)
without computing any data. It follows the RTL register for register where timing is
decided: the fetcher, the decoder's stages and instruction queue, the issue stage's hazard
checks, the four units (the load unit's ``LOAD_QUANT`` check, the store unit's ``STORE_Q``
stream through the requantizer and its queue), the array's latency, the accumulator's
read-modify-write, the DMA's bursts and row geometry. ``tb/test_timing.py`` checks that it
equals the RTL's own counters, cycle for cycle, on a sweep of GEMM shapes and
configurations, and ``tb/test_timing_quant.py`` on quantized GEMMs, convolutions, depthwise
convolutions, whole networks and random programs of every opcode.

The DRAM is modelled as the simulation's DRAM answers without back-pressure (the HDL one,
:class:`sim.dram.HDLDram`, whose latencies are the defaults here, and cocotbext-axi's AXI4
slave, which answers the same, cycle for cycle: tb/test_dram_models.py): a read command's
first beat arrives in the third cycle after the command is taken and the rest follow one per
cycle (the reader sends an address a cycle, ahead of the data, but leaves at most
:data:`hw.dma.MAX_READS_OUTSTANDING` bursts waiting for theirs, which only a DRAM slower than
that many cycles a round trip feels); write addresses and data are always accepted; a burst's
write response comes two cycles after its last beat. Those two delays are
:data:`READ_LATENCY` and :data:`WRITE_RESPONSE_LATENCY`, and :func:`predict` takes others for
a DRAM that answers with other fixed delays but otherwise the same way (bursts streamed back
to back, writes never stalled). Other DRAM timing changes the count, not the results; so does
back-pressure.

A :class:`Memory` adds bandwidth: read beats at most one every ``read_beat_cycles``, write
beats accepted at most one every ``write_beat_cycles``, and optionally one data bus that reads
and writes take turns on. :data:`MEMORIES` names two: ``"sim"`` (the above, exact) and
``"ulx3s"``, the SoC's 16-bit SDRAM behind LiteDRAM (soc/), which is not exact: refresh, row
misses and LiteDRAM's queues and arbitration are not modelled, and docs/board.md states
the error against the simulated SoC.

Every instruction is modelled. Programs are assumed to run without error, and to start as a
compiled program leaves the NPU: with no weight tile waiting for the ``MATMUL`` that commits
it (a ``PRELOAD`` with no ``MATMUL`` after it would carry its commit into the next program).
A store over the program itself (which makes the fetcher read it again) is not modelled.
"""

from collections import deque
from dataclasses import dataclass

from hw.accumulator import WRITE_LATENCY
from hw.bram import READ_LATENCY as SRAM_READ_LATENCY
from hw.config import FETCH_BURST, FETCH_HIGH_WATER, FETCH_LOW_WATER
from hw.controller.decoder import LATENCY as DECODE_LATENCY
from hw.controller.store_unit import StoreUnit
from hw.dma import MAX_READS_OUTSTANDING
from hw.isa import INSTR_BYTES, Opcode
from hw.requant import Requantizer
from sim import dram as simulated_dram

from . import codec
from .errors import NPUValueError


__all__ = ["Timing", "Memory", "MEMORIES", "memory_for", "predict", "predict_gemm",
           "READ_LATENCY", "WRITE_RESPONSE_LATENCY", "QUANT_CHECK_CYCLES"]


#: Cycles from the cycle a read command is granted to its first data beat: the command is
#: taken (cycle ``g``), the DMA sends its first address (``g + 1``), the first beat arrives in
#: ``g + 3``: the cycle of the address plus the simulated DRAM's latency from address to
#: first beat. The default of :func:`predict`'s ``read_latency``.
READ_LATENCY = 1 + simulated_dram.READ_LATENCY
#: Cycles from a burst's last write beat to its write response (the simulated DRAM's). The
#: default of :func:`predict`'s ``write_response_latency``.
WRITE_RESPONSE_LATENCY = simulated_dram.WRITE_RESPONSE_LATENCY
#: The smallest delays an AXI4 slave can have: a first beat in the cycle after its address,
#: which the DMA sends in the cycle after the grant; a response in the cycle after the last beat.
_MIN_READ_LATENCY = 2
_MIN_WRITE_RESPONSE_LATENCY = 1

#: The ULX3S's SDRAM (MT48LC16M16, :data:`soc.memory_map.SDRAM_DATA_WIDTH`): 16 bits a cycle
#: at 1:1, single data rate.
ULX3S_SDRAM_BITS = 16
#: Fitted (least squares of the relative error) to 18 GEMMs on the simulated SoC
#: (soc/simulation.py: LiteDRAM and its model of that chip at 50 MHz), 2x2 and 4x4
#: (docs/board.md). Fitted, not measured: LiteDRAM's latencies vary with its queues,
#: and its multiplexer serves reads up to 32 cycles and writes up to 16 before it turns
#: (``litedram.core.multiplexer``), which the one turnaround stands for.
ULX3S_READ_LATENCY = 18
ULX3S_WRITE_RESPONSE_LATENCY = 8
ULX3S_TURNAROUND_CYCLES = 16


@dataclass(frozen=True)
class Memory:
    """The DRAM as the cycle model sees it from the NPU's AXI4 master.

    Attributes
    ----------
    name : str
        What it is, for reports.
    read_latency : int
        Cycles from a granted read command to its first beat (at least 2; see
        :data:`READ_LATENCY`).
    write_response_latency : int
        Cycles from a burst's last write beat to its response (at least 1).
    read_beat_cycles : int
        Cycles between read beats: the first beat of a burst comes ``read_latency - 1`` cycles
        after its address or ``read_beat_cycles`` after the beat before, whichever is later.
    write_beat_cycles : int
        Cycles between write beats accepted (1: one a cycle, the simulated DRAM).
    shared_bus : bool
        Whether reads and writes take turns on one data bus (an SDRAM's), each beat holding it
        for its beat cycles: a write beat waits for the read bursts already granted, a read
        burst for the write beats already taken. False: the AXI4 channels apart, as the
        simulated DRAM has them.
    turnaround_cycles : int
        On a shared bus, the cycles it stays idle between a read and a write beat, either way.
    """
    name: str
    read_latency: int = READ_LATENCY
    write_response_latency: int = WRITE_RESPONSE_LATENCY
    read_beat_cycles: int = 1
    write_beat_cycles: int = 1
    shared_bus: bool = False
    turnaround_cycles: int = 0

    def __post_init__(self):
        _check_latency("read_latency", self.read_latency, _MIN_READ_LATENCY)
        _check_latency("write_response_latency", self.write_response_latency,
                       _MIN_WRITE_RESPONSE_LATENCY)
        _check_latency("read_beat_cycles", self.read_beat_cycles, 1)
        _check_latency("write_beat_cycles", self.write_beat_cycles, 1)
        _check_latency("turnaround_cycles", self.turnaround_cycles, 0)
        if not isinstance(self.shared_bus, bool):
            raise NPUValueError(f"shared_bus must be True or False, not {self.shared_bus!r}")


def _simulated_dram(bus_width):
    return Memory("sim")


def _ulx3s_sdram(bus_width):
    # LiteDRAM's port down-converter turns a beat into bus_width / 16 SDRAM column commands
    # and spends a cycle in IDLE taking the next (litedram.frontend.adapter).
    ratio = bus_width // ULX3S_SDRAM_BITS
    beat = ratio + 1 if ratio > 1 else 1
    return Memory("ulx3s", read_latency=ULX3S_READ_LATENCY,
                  write_response_latency=ULX3S_WRITE_RESPONSE_LATENCY,
                  read_beat_cycles=beat, write_beat_cycles=beat, shared_bus=True,
                  turnaround_cycles=ULX3S_TURNAROUND_CYCLES)


#: The named memories, each a function of the NPU's bus width in bits: ``"sim"``, the
#: project's simulated DRAM (exact: tb/test_timing.py), and ``"ulx3s"``, the ULX3S's SDRAM
#: behind LiteDRAM in the SoC (soc/), within the error docs/board.md states.
MEMORIES = {"sim": _simulated_dram, "ulx3s": _ulx3s_sdram}


def memory_for(memory, config):
    """The :class:`Memory` that ``memory`` names (a key of :data:`MEMORIES`) at ``config``'s
    bus width; a :class:`Memory` is returned as it is."""
    if isinstance(memory, Memory):
        return memory
    if memory not in MEMORIES:
        raise NPUValueError(f"memory must be a Memory or one of {', '.join(MEMORIES)}, "
                            f"not {memory!r}")
    return MEMORIES[memory](config.bus_width)


#: Cycles a ``LOAD_QUANT`` holds the load unit after the reader's ``done``: the unit checks
#: the staged rows (``check``), then ORs the lanes' verdicts (``lanes_checked``), then
#: registers the verdict (``judged``), and is idle in the cycle after that
#: (``hw/controller/load_unit.py``).
QUANT_CHECK_CYCLES = 3
#: Cycles from a ``STORE_Q`` row's read to its requantized row entering the store unit's
#: queue (the queue's write): the accumulator's read and the requantizer. The queue (a
#: ``SyncFIFO`` and its read register) adds its two cycles of :attr:`StoreUnit.ROUND_TRIP`
#: as the model steps it.
_REQUANT_ARRIVAL = SRAM_READ_LATENCY + Requantizer.latency
assert StoreUnit.ROUND_TRIP == _REQUANT_ARRIVAL + 2


@dataclass(frozen=True)
class Timing:
    """What :func:`predict` found.

    Attributes
    ----------
    cycles : int
        The ``CYCLES`` register at the end: cycles from start to done.
    perf : dict
        The performance counters, by the names of :data:`hw.isa.PERF_COUNTERS`, and
        ``cycles``.
    marks : dict
        ``{instruction index: counters}`` for the ``marks`` asked of :func:`predict`: the
        counters (and ``cycles``, the cycle count so far) as that instruction issues.
    """
    cycles: int
    perf: dict
    marks: dict = None


def _beats(addr, row_bytes, bus_bytes):
    return (addr % bus_bytes + row_bytes + bus_bytes - 1) // bus_bytes


def _read_rows(grant, command, bus, read_latency, beat_cycles, free_from=0, slots=None):
    """The cycles in which the rows of a read command granted in cycle ``grant`` leave the
    DMA reader, and its beats.

    The reader sends a burst's address a cycle (the first in ``grant + 1``), while fewer than
    :data:`~hw.dma.MAX_READS_OUTSTANDING` bursts wait for data: a burst's slot frees in the
    cycle after its last beat. A burst's first beat comes ``read_latency - 1`` cycles after
    its address, or ``beat_cycles`` after the last beat of the burst before, and its beats
    follow ``beat_cycles`` apart; a row leaves in the cycle after its last beat. Bursts are
    cut as the DMA cuts them, at 4 KiB and at 256 beats.

    On a memory whose reads and writes share one data bus, a beat holds the bus for the
    ``beat_cycles`` up to and including its cycle: none starts before ``free_from`` (the
    writes' end), and each burst's cycles on the bus go into ``slots`` as ``(first, end)``.
    """
    addr, rows, row_bytes, stride = command
    address = grant                          # the cycle of the last address sent
    beat = grant + read_latency - beat_cycles   # the cycle of the last beat (none yet)
    ends = deque()                           # last-beat cycles of the bursts outstanding
    times = []
    beats = 0
    for row in range(rows):
        row_addr = addr + row * stride
        beat_addr = row_addr - row_addr % bus
        left = _beats(row_addr, row_bytes, bus)
        beats += left
        while left:
            length = min(left, (4096 - beat_addr % 4096) // bus, 256)
            address += 1
            if len(ends) == MAX_READS_OUTSTANDING:
                address = max(address, ends.popleft() + 1)
            first = max(address + read_latency - 1, beat + beat_cycles,
                        free_from + beat_cycles - 1)
            beat = first + (length - 1) * beat_cycles
            if slots is not None:
                slots.append((first - beat_cycles + 1, beat + 1))
            ends.append(beat)
            beat_addr += length * bus
            left -= length
        times.append(beat + 1)
    return times, beats


def _bus_taken(slots, start, cycles, turnaround):
    """Whether a read burst holds the bus in any of the ``cycles`` from ``start``, or within
    ``turnaround`` cycles of them (slots that ended are dropped)."""
    while slots and slots[0][1] + turnaround <= start:
        slots.popleft()
    return any(first < start + cycles + turnaround and start < end + turnaround
               for first, end in slots)


def _overlap(a, a_rows, b, b_rows):
    return a < b + b_rows and b < a + a_rows


_BLOCKS = (Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.STORE, Opcode.STORE_Q)
_STORES = (Opcode.STORE, Opcode.STORE_Q)


def _decode_program(words):
    program = []
    for index, word in enumerate(words):
        opcode, fields = codec.decode(word)
        if opcode is None:
            raise NPUValueError(f"instruction {index} is an illegal opcode: the cycle model "
                                f"covers programs that run without error")
        lo = hi = 0
        if opcode in _BLOCKS:
            lo = fields["dram_addr"]
            hi = lo + (fields["rows"] - 1) * fields["dram_stride"] + fields["row_bytes"]
        elif opcode is Opcode.LOAD_QUANT:        # its two rows (the decoder's bounds)
            lo = fields["dram_addr"]
            hi = lo + fields["dram_stride"] + fields["row_bytes"]
        program.append((opcode, fields, lo, hi))
    if not program or program[-1][0] is not Opcode.END:
        raise NPUValueError("the cycle model needs a program that ends in END")
    return program


def _check_latency(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise NPUValueError(f"{name} must be a whole number of cycles, at least {minimum}, "
                            f"not {value!r}")


def predict(config, words, prog_addr, *, memory="sim", read_latency=None,
            write_response_latency=None, max_cycles=1 << 40, marks=()):
    """Cycles and counters of the program ``words`` (128-bit ints) at ``prog_addr`` on the
    NPU of ``config``, from start to done.

    ``memory`` is the DRAM: a name in :data:`MEMORIES` (``"sim"``, the default, or
    ``"ulx3s"``) or a :class:`Memory`. ``read_latency`` and ``write_response_latency``, when
    given, replace its latencies: the delay from a granted read command to its first beat (at
    least 2) and from a burst's last write beat to its response (at least 1); see
    :data:`READ_LATENCY` and :data:`WRITE_RESPONSE_LATENCY`.

    Raises :class:`~sw.errors.NPUValueError` for an illegal opcode, a program that does not
    end in END, an unknown memory or a latency below its minimum, and ``RuntimeError`` if the
    program does not end within ``max_cycles``.

    ``marks`` (instruction indices) asks for the counters as each of them issues
    (:attr:`Timing.marks`): the difference between two marks is what the instructions between
    them cost, as a per-layer profile wants.
    """
    memory = memory_for(memory, config)
    marks = frozenset(marks)
    snapshots = {}
    if read_latency is None:
        read_latency = memory.read_latency
    if write_response_latency is None:
        write_response_latency = memory.write_response_latency
    _check_latency("read_latency", read_latency, _MIN_READ_LATENCY)
    _check_latency("write_response_latency", write_response_latency,
                   _MIN_WRITE_RESPONSE_LATENCY)
    read_beat_cycles, write_beat_cycles = memory.read_beat_cycles, memory.write_beat_cycles
    # One data bus for reads and writes: the read bursts' cycles on it, planned at their
    # grant, and the cycle the last write beat taken leaves it free.
    read_slots = deque() if memory.shared_bus else None
    write_free_from = 0
    program = _decode_program(words)
    prog_len = len(program)
    rows, cols = config.rows, config.cols
    bus = config.bus_bytes
    latency = rows + cols - 1                # the array: activation row in -> result out
    queue_depth = StoreUnit.QUEUE_DEPTH

    # Fetcher, decoder (its three stages, instruction queue and output register).
    fetch_pc = 0                             # instructions the fetcher delivered
    level = 0                                # the queue's level
    decoding = deque()                       # cycles in which delivered words enter the queue
    dec_valid = False
    pc = 0                                   # the instruction at the issue stage
    # DMA reader: the command it runs, as the cycles in which its rows arrive.
    reader_busy = reader_is_load = False
    row_times = deque()
    read_done_at = 0
    # Load unit: LOAD_SPAD, LOAD_ACC (whose rows go to the accumulator's write port) or
    # LOAD_QUANT (busy until its check, QUANT_CHECK_CYCLES after the reader's done).
    ld_busy = ld_sent = False
    ld_kind = None
    ld_cmd = None                            # (addr, rows, row_bytes, stride)
    ld_local = ld_rows = ld_count = 0
    ld_judged_at = None                      # LOAD_QUANT: the cycle of its verdict
    # Weight loader.
    wl_busy = False
    wl_addr = wl_count = 0
    commit_pending = False
    guard = 0                                # cycles until the shadow weights may shift
    # Streamer, array and write-back.
    st_busy = False
    st_spad = st_rows = st_count = st_macs = 0
    results = deque()                        # cycles in which a result row leaves the array
    wb_slots = deque()                       # (acc_addr, rows) of MATMULs still writing
    out_count = 0
    # The rows of the accumulator's writes (results, LOAD_ACC rows) accepted in the cycles
    # before (None: none), newest first.
    acc_writes = [None] * WRITE_LATENCY
    # Store unit (IDLE, COMMAND, READ, ROW for STORE, STREAM for STORE_Q, WAIT) and DMA
    # writer (IDLE, ROW, ADDRESS, DATA, RESPONSES) with its one-row buffer.
    sd_state = "IDLE"
    sd_acc = sd_rows = sd_count = sd_lo = sd_hi = 0
    sd_quantized = False
    sd_cmd = None
    # STORE_Q: reads still to make, rows read and not handed over, the cycles in which
    # requantized rows enter the queue, the queue's level and its read register's flag.
    sq_reads_left = sq_in_flight = sq_level = 0
    sq_arrivals = deque()
    sq_valid = False
    wr_state = "IDLE"
    wr_row_addr = wr_rows_left = wr_row_bytes = wr_stride = 0
    wr_beat_addr = wr_beats_left = wr_burst_left = 0
    wr_buffered = False                      # a row waits in the writer's buffer
    wr_accept_at = 0                         # the first cycle the DRAM takes a write beat in
    outstanding = 0
    responses = deque()                      # cycles in which a write response arrives

    stall_fetch = stall_load = stall_store = stall_array = 0
    array_rows = useful_macs = instructions = 0
    read_beats = write_beats = 0

    t = 1                                    # the cycle the program starts in: CYCLES = 1
    while True:
        if t > max_cycles:
            raise RuntimeError(f"the program did not end within {max_cycles} cycles")

        # ------------------------------------------------------------ this cycle
        read_row = bool(row_times) and row_times[0] == t
        read_done = reader_busy and read_done_at == t
        result_valid = bool(results) and results[0] == t

        issue = False
        opcode = None
        if dec_valid:
            opcode, fields, head_lo, head_hi = program[pc]
            sd_busy = sd_state != "IDLE"
            to_spad = ld_busy and ld_kind is Opcode.LOAD_SPAD
            if opcode is Opcode.MATMUL:
                blocked_load = ((ld_busy and ld_kind is Opcode.LOAD_ACC) or
                                (to_spad and _overlap(fields["spad_addr"], fields["rows"],
                                                      ld_local, ld_rows)))
                blocked_store = sd_busy and _overlap(fields["acc_addr"], fields["rows"],
                                                     sd_acc, sd_rows)
                blocked_array = ((st_busy and st_count != st_rows - 1) or len(wb_slots) == 2
                                 or wl_busy)
            elif opcode is Opcode.LOAD_SPAD:
                blocked_load = ld_busy
                blocked_store = sd_busy and head_lo < sd_hi and sd_lo < head_hi
                blocked_array = (
                    (st_busy and _overlap(fields["local_addr"], fields["rows"], st_spad,
                                          st_rows)) or
                    (wl_busy and _overlap(fields["local_addr"], fields["rows"], wl_addr,
                                          rows)))
            elif opcode is Opcode.PRELOAD:
                blocked_load = to_spad and _overlap(fields["spad_addr"], rows, ld_local,
                                                    ld_rows)
                blocked_store = False
                blocked_array = wl_busy
            elif opcode in _STORES:
                blocked_load = ld_busy
                blocked_store = sd_busy
                blocked_array = any(
                    _overlap(fields["acc_addr"], fields["rows"], a, r) for a, r in wb_slots
                ) or any(row is not None and                 # a write its read would miss
                         fields["acc_addr"] <= row < fields["acc_addr"] + fields["rows"]
                         for row in acc_writes[:SRAM_READ_LATENCY])
            elif opcode is Opcode.LOAD_ACC:  # on a drained array, after the stores
                blocked_load = ld_busy
                blocked_store = sd_busy
                blocked_array = st_busy or bool(wb_slots) or any(
                    row is not None for row in acc_writes)
            elif opcode is Opcode.LOAD_QUANT:    # after the stores (the state they use)
                blocked_load = ld_busy
                blocked_store = sd_busy
                blocked_array = False
            else:                            # END
                blocked_load = ld_busy or reader_busy
                blocked_store = sd_busy
                blocked_array = (wl_busy or st_busy or bool(wb_slots) or
                                 any(row is not None for row in acc_writes))
            if blocked_load:
                stall_load += 1
            elif blocked_store:
                stall_store += 1
            elif blocked_array:
                stall_array += 1
            else:
                issue = True
        else:
            stall_fetch += 1

        if issue and opcode is Opcode.END:
            instructions += 1
            break

        # The DMA reader: the fetcher goes first while the queue runs low.
        grant = None
        if not reader_busy:
            held = level + len(decoding)      # the fetcher's count of its words
            fetch_want = fetch_pc != prog_len and held <= FETCH_HIGH_WATER
            load_want = ld_busy and not ld_sent
            if fetch_want and (not load_want or held < FETCH_LOW_WATER):
                grant = (prog_addr + fetch_pc * INSTR_BYTES,
                         min(FETCH_BURST, prog_len - fetch_pc), INSTR_BYTES, INSTR_BYTES)
                grant_load = False
            elif load_want:
                grant, grant_load = ld_cmd, True

        write_done = wr_state == "RESPONSES" and outstanding == 0
        b_fire = bool(responses) and responses[0] == t

        # ------------------------------------------------------------ next cycle
        # Decoder: a word the DMA delivers in cycle t is on the fetcher's register in t + 1
        # and may leave the decoder's queue for its head DECODE_LATENCY cycles later (input
        # register, three stages, the queue and its read register): the queue's level
        # counts it from t + 1 + DECODE_LATENCY.
        next_level = level
        if decoding and decoding[0] == t:
            decoding.popleft()
            next_level += 1
        load_acc_row = None                  # a LOAD_ACC row written in this cycle
        if read_row:
            row_times.popleft()
            if not reader_is_load:
                decoding.append(t + DECODE_LATENCY)
                fetch_pc += 1
            else:
                if ld_kind is Opcode.LOAD_ACC:
                    load_acc_row = ld_local + ld_count
                ld_count += 1
        if level > 0 and (not dec_valid or issue):
            next_level -= 1
            dec_valid = True
        elif issue:
            dec_valid = False
        level = next_level

        # Reader, and the load unit's end: the cycle after the reader's done, or for a
        # LOAD_QUANT the cycle after its verdict.
        if read_done:
            reader_busy = False
            if reader_is_load:
                if ld_kind is Opcode.LOAD_QUANT:
                    ld_judged_at = t + QUANT_CHECK_CYCLES
                else:
                    ld_busy = False
        if ld_judged_at == t:
            ld_busy = False
            ld_judged_at = None
        if grant is not None:
            reader_busy, reader_is_load = True, grant_load
            if grant_load:
                ld_sent = True
            free_from = (write_free_from + memory.turnaround_cycles
                         if memory.shared_bus else 0)
            times, beats = _read_rows(t, grant, bus, read_latency, read_beat_cycles,
                                      free_from, read_slots)
            row_times.extend(times)
            read_done_at = times[-1]
            read_beats += beats

        # Weight loader.
        wl_read = wl_busy and guard == 0
        if guard:
            guard -= 1
        if wl_read:
            if wl_count == rows - 1:
                wl_busy = False
                commit_pending = True
            wl_count += 1

        # Streamer.
        if st_busy:
            # This cycle's row was read in the cycle before (the streamer reads a cycle
            # ahead): it enters the array SRAM_READ_LATENCY cycles after that read.
            results.append(t - 1 + SRAM_READ_LATENCY + latency)
            array_rows += 1
            useful_macs += st_macs
            if st_count == st_rows - 1:
                st_busy = False
            st_count += 1

        # Results into the accumulator, oldest MATMUL first; a LOAD_ACC row (never in the
        # cycle of a result: it issues on a drained array) through the same write port.
        if result_valid:
            write_row = wb_slots[0][0] + out_count
        else:
            write_row = load_acc_row
        acc_writes = [write_row] + acc_writes[:-1]
        if result_valid:
            results.popleft()
            if out_count == wb_slots[0][1] - 1:
                wb_slots.popleft()
                out_count = 0
            else:
                out_count += 1

        # Store unit and writer (their handshakes use this cycle's states). Every row goes
        # into the writer's one-row buffer, which takes a row whenever it is empty (row.ready
        # is its empty flag, whatever the writer's state), and the writer loads a row only
        # from there: in ROW, or at the end of the row before (DATA). Loading a row moves
        # the writer's row address on to the next. A STORE hands over a row from its ROW
        # state, a STORE_Q from its queue's read register (sq_valid).
        next_sd, next_wr = sd_state, wr_state
        row_ready = not wr_buffered
        sq_valid_now = sq_valid
        row_taken = (sd_state == "ROW" or sq_valid) and row_ready
        quantized_read = False
        if sd_state == "COMMAND":
            if wr_state == "IDLE":
                # The first row is read as the writer takes the command.
                next_sd = "STREAM" if sd_quantized else "READ"
                quantized_read = sd_quantized
                wr_row_addr, wr_rows_left, wr_row_bytes, wr_stride = sd_cmd
                next_wr = "ROW"
        elif sd_state == "READ":
            next_sd = "ROW"
        elif sd_state == "ROW":
            if row_taken:
                next_sd = "WAIT" if sd_count == sd_rows - 1 else "READ"
                sd_count += 1
        elif sd_state == "STREAM":
            # Read while rows are left and fewer than the queue holds are in flight.
            if sq_reads_left and sq_in_flight < queue_depth:
                quantized_read = True
                sq_reads_left -= 1
            if row_taken:
                if sd_count == sd_rows - 1:
                    next_sd = "WAIT"
                sd_count += 1
        elif sd_state == "WAIT":
            if write_done:
                next_sd = "IDLE"
        # STORE_Q's rows: requantized into the queue (a SyncFIFO, then its read register,
        # which takes the FIFO's front row when empty or handed over).
        if sq_arrivals or sq_level or sq_valid:
            entered = bool(sq_arrivals) and sq_arrivals[0] == t
            if entered:
                sq_arrivals.popleft()
            if sq_level and (not sq_valid or row_ready):
                sq_level -= 1
                sq_valid = True
            elif row_ready:
                sq_valid = False
            sq_level += entered
        if quantized_read:
            sq_arrivals.append(t + _REQUANT_ARRIVAL)
        sq_in_flight += quantized_read - (sq_valid_now and row_ready)
        load = False
        if wr_state == "ROW":
            load = wr_buffered
        elif wr_state == "ADDRESS":
            length = min(wr_beats_left, (4096 - wr_beat_addr % 4096) // bus, 256)
            wr_beat_addr += length * bus
            wr_beats_left -= length
            wr_burst_left = length
            outstanding += 1
            next_wr = "DATA"
        elif wr_state == "DATA" and t >= wr_accept_at and not (
                read_slots is not None and _bus_taken(read_slots, t, write_beat_cycles,
                                                      memory.turnaround_cycles)):
            wr_accept_at = write_free_from = t + write_beat_cycles
            write_beats += 1
            wr_burst_left -= 1
            if wr_burst_left == 0:
                responses.append(t + write_response_latency)
                if wr_beats_left:
                    next_wr = "ADDRESS"
                elif wr_rows_left == 1:
                    next_wr = "RESPONSES"
                else:
                    wr_rows_left -= 1
                    load = wr_buffered
                    if not load:
                        next_wr = "ROW"
        elif wr_state == "RESPONSES" and write_done:
            next_wr = "IDLE"
        if load:
            wr_beat_addr = wr_row_addr - wr_row_addr % bus
            wr_beats_left = _beats(wr_row_addr, wr_row_bytes, bus)
            wr_row_addr += wr_stride
            next_wr = "ADDRESS"
        # A row is taken only into an empty buffer, and a row is loaded only from a full one.
        wr_buffered = (wr_buffered and not load) or row_taken
        if b_fire:
            responses.popleft()
            outstanding -= 1
        sd_state, wr_state = next_sd, next_wr

        # The instruction issued.
        if issue:
            if pc in marks:
                snapshots[pc] = dict(
                    array_rows=array_rows, useful_macs=useful_macs, stall_fetch=stall_fetch,
                    stall_load=stall_load, stall_store=stall_store, stall_array=stall_array,
                    instructions=instructions, read_bytes=read_beats * bus,
                    write_bytes=write_beats * bus, cycles=t)
            instructions += 1
            pc += 1
            if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.LOAD_QUANT):
                ld_busy, ld_sent, ld_kind, ld_count = True, False, opcode, 0
                if opcode is Opcode.LOAD_QUANT:      # two rows: multipliers, shifts
                    ld_local = ld_rows = 0
                    ld_cmd = (fields["dram_addr"], 2, fields["row_bytes"],
                              fields["dram_stride"])
                else:
                    ld_local, ld_rows = fields["local_addr"], fields["rows"]
                    ld_cmd = (fields["dram_addr"], fields["rows"], fields["row_bytes"],
                              fields["dram_stride"])
            elif opcode is Opcode.PRELOAD:
                wl_busy, wl_addr, wl_count = True, fields["spad_addr"], 0
            elif opcode is Opcode.MATMUL:
                wb_slots.append((fields["acc_addr"], fields["rows"]))
                if commit_pending:
                    guard = rows + cols - 1
                st_busy, st_spad, st_rows, st_count = (True, fields["spad_addr"],
                                                       fields["rows"], 0)
                st_macs = (fields.get("k_width") or rows) * (fields.get("n_width") or cols)
                commit_pending = False
            elif opcode in _STORES:
                sd_state = "COMMAND"
                sd_acc, sd_rows, sd_count = fields["acc_addr"], fields["rows"], 0
                sd_lo, sd_hi = head_lo, head_hi
                sd_quantized = opcode is Opcode.STORE_Q
                sq_reads_left = fields["rows"] - 1   # after the one as the command is taken
                sd_cmd = (fields["dram_addr"], fields["rows"], fields["row_bytes"],
                          fields["dram_stride"])
        t += 1

    cycles = t + 1
    perf = dict(array_rows=array_rows, useful_macs=useful_macs, stall_fetch=stall_fetch,
                stall_load=stall_load, stall_store=stall_store, stall_array=stall_array,
                instructions=instructions, read_bytes=read_beats * bus,
                write_bytes=write_beats * bus, cycles=cycles)
    return Timing(cycles=cycles, perf=perf, marks=snapshots)


def predict_gemm(config, m, k, n, *, schedule="auto", memory="sim", read_latency=None,
                 write_response_latency=None):
    """:func:`predict` for the program the driver runs for ``(m x k) @ (k x n)`` on
    ``config`` (:func:`sw.driver.gemm`): the same plan, DRAM layout and instructions, and
    the same memory and DRAM latencies as :func:`predict` takes."""
    from .compiler import compile_gemm, plan_gemm
    from .driver import layout_dram
    from .operands import check_config

    config = check_config(config)
    plan = plan_gemm(config, m, k, n, schedule=schedule)
    layout = layout_dram(m, k, n, plan.instructions)
    program = compile_gemm(config, m, k, n, a_addr=layout.a_addr, b_addr=layout.b_addr,
                           c_addr=layout.c_addr, a_stride=layout.a_stride,
                           b_stride=layout.b_stride, plan=plan)
    return predict(config, program.words, layout.program_addr, memory=memory,
                   read_latency=read_latency, write_response_latency=write_response_latency)
