"""How many cycles a program may take: an upper bound read off its instruction words.

Every controller state waits only for handshakes that the DMA and the bus complete
(docs/architecture.md), so an instruction's cycles are a fixed part plus, for each bus
handshake it needs, the longest the DRAM can make it wait. Counting the handshakes from the
instruction's fields gives a bound for any instruction word, legal or not:

* fetch: one AR and ``ceil(16 / bus_bytes)`` R beats;
* a load of ``rows`` rows of ``row_bytes`` bytes: per row one AR per burst and at most
  ``ceil((row_bytes + bus_bytes - 1) / bus_bytes)`` R beats (a row may start anywhere in a
  beat); a burst is cut at 256 beats and at 4 KiB, so a row has at most ``beats // 256 + 2``;
* a store: per row one AW and one B per burst and the same number of W beats (and for
  ``STORE_Q``, whose rows stream, once the round trip through the requantizer,
  ``StoreUnit.ROUND_TRIP`` cycles);
* ``PRELOAD``: ``R`` scratchpad reads; ``MATMUL``: ``rows`` reads plus the array's
  ``R + C - 1`` cycles of latency.

An instruction whose operands fail the checks ends in its decode cycle, so ``rows`` never
counts past the memory it addresses and ``row_bytes`` never past a row: the longest legal
instruction moves ``max(spad_depth, acc_depth) <= 65536`` rows, and with random words most
instructions fail fast.

``wait`` is the longest a single handshake can take, in cycles: :data:`WAIT` for the bench
as it is, :data:`WAIT_BACKPRESSURE` with :class:`sim.bench.Backpressure` (a pause of up to 6
cycles on the channel plus up to 12 cycles of DRAM latency, plus the models' own queueing).
"""

from hw.isa import INSTR_BYTES, Opcode
from hw.controller.store_unit import StoreUnit
from sw import codec


__all__ = ["WAIT", "WAIT_BACKPRESSURE", "instruction_bound", "program_bound",
           "longest_instruction_bound", "gemm_cycles_estimate"]


#: Cycles the bench's DRAM takes, at most, for one handshake (cocotbext-axi answers within
#: two or three cycles; four leaves a margin).
WAIT = 4
#: The same with random back-pressure on.
WAIT_BACKPRESSURE = 24
#: Cycles an instruction spends outside its handshakes: FETCH, FETCH_WAIT, DECODE, NEXT,
#: the DMA's row emission and the accumulator's read-modify-write.
FIXED = 16


def _ceil(a, b):
    return -(-a // b)


def _row_handshakes(row_bytes, bus_bytes, per_burst):
    beats = _ceil(row_bytes + bus_bytes - 1, bus_bytes)
    bursts = beats // 256 + 2
    return beats + per_burst * bursts


def instruction_bound(config, word, wait=WAIT):
    """Cycles from the fetch of ``word`` to the fetch of the next instruction, at most."""
    bus_bytes = config.bus_bytes
    fetch = (1 + _ceil(INSTR_BYTES, bus_bytes)) * wait
    opcode, fields = codec.decode(word)
    if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC, Opcode.STORE, Opcode.STORE_Q):
        depth = config.spad_depth if opcode == Opcode.LOAD_SPAD else config.acc_depth
        width = config.spad_row_bytes if opcode == Opcode.LOAD_SPAD else config.acc_row_bytes
        rows = min(fields["rows"], depth)
        row_bytes = min(fields["row_bytes"], width)
        per_burst = 1 if opcode in (Opcode.LOAD_SPAD, Opcode.LOAD_ACC) else 2
        # STORE_Q's rows stream through the requantizer: its round trip counts once.
        requantize = StoreUnit.ROUND_TRIP if opcode == Opcode.STORE_Q else 0
        per_row = 4 + _row_handshakes(row_bytes, bus_bytes, per_burst) * wait
        work = 4 + requantize + rows * per_row
    elif opcode == Opcode.LOAD_QUANT:
        row_bytes = min(fields["row_bytes"], config.acc_row_bytes)
        work = 4 + 2 * (4 + _row_handshakes(row_bytes, bus_bytes, 1) * wait)
    elif opcode == Opcode.PRELOAD:
        work = config.rows + 2
    elif opcode == Opcode.MATMUL:
        work = min(fields["rows"], config.spad_depth) + config.rows + config.cols + 4
    else:
        work = 0        # END, or an illegal opcode: it stops in its decode cycle
    return FIXED + fetch + work


def program_bound(config, words, wait=WAIT):
    """Cycles a straight-line program of ``words`` takes at most, whatever it holds."""
    return sum(instruction_bound(config, word, wait) for word in words)


def longest_instruction_bound(config, wait=WAIT):
    """The bound of the longest instruction ``config`` accepts (a store of every
    accumulator row or a load of every scratchpad row, the widest and worst aligned)."""
    spad_rows, acc_rows = min(config.spad_depth, 0xFFFF), min(config.acc_depth, 0xFFFF)
    load = codec.encode(Opcode.LOAD_SPAD, local_addr=0, rows=spad_rows,
                        row_bytes=config.spad_row_bytes, dram_addr=1, dram_stride=4096)
    load_acc = codec.encode(Opcode.LOAD_ACC, local_addr=0, rows=acc_rows,
                            row_bytes=config.acc_row_bytes, dram_addr=1, dram_stride=4096)
    store = codec.encode(Opcode.STORE, acc_addr=0, rows=acc_rows,
                         row_bytes=config.acc_row_bytes, dram_addr=4, dram_stride=4096)
    matmul = codec.encode(Opcode.MATMUL, spad_addr=0, acc_addr=0,
                          rows=min(spad_rows, acc_rows), accumulate=1)
    return max(instruction_bound(config, word, wait) for word in (load, load_acc, store,
                                                                  matmul))


def gemm_cycles_estimate(plan, bus_bytes):
    """Roughly the cycles a GEMM of ``plan`` (:class:`sw.compiler.Plan`) takes on the
    bench without back-pressure, for budgeting simulation time (within 1.5x either way)."""
    activation_rows = plan.m * plan.k_tiles * (1 if plan.schedule == "resident"
                                               else plan.n_tiles)
    load_rows = plan.weight_loads * plan.rows + activation_rows
    store_rows = plan.m * plan.n_tiles
    return int(plan.instructions * (10 + _ceil(INSTR_BYTES, bus_bytes))
               + (plan.dram_bytes_read + plan.dram_bytes_written) / bus_bytes
               + 2 * load_rows + 4 * store_rows
               + plan.m * plan.weight_tiles
               + plan.weight_loads * (2 * plan.rows + plan.cols + 6))
