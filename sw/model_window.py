"""The fast path of the instruction-level model (:mod:`sw.model`): a program decoded into numpy
columns once, then run a window of up to 65,536 instructions at a time as array operations.

A window is a run of instructions that ends before the first ``END``, illegal opcode or
failing instruction (:func:`analyse_window` checks every operand as the handlers do, in the
same order), and before any instruction whose effect the window could not reproduce:

* a load (``LOAD_SPAD``, ``LOAD_ACC``, ``LOAD_QUANT``) whose DRAM block may overlap a block
  that an earlier ``STORE`` or ``STORE_Q`` of the window writes (read after write through the
  DRAM: the window's loads all read the DRAM as it was at its start);
* the instruction after a store that may write over the program's words still to be fetched
  (the decoded columns would be stale: they are decoded again).

Both tests compare the blocks' bounding intervals, so they may end a window early, never late.
Inside a window every effect is that of the instructions run one by one, in order
(:func:`run_window`):

* **Scratchpad.** The rows that each ``PRELOAD`` (weights) and ``MATMUL`` (activations) reads
  are traced back to the ``LOAD_SPAD`` that last wrote them before it, or to the scratchpad
  as the window found it (:func:`_scratchpad`, by segments of rows sorted with numpy's stable
  radix sort); the DRAM rows the loads move are gathered once.
* **Weights.** ``MATMUL`` ``m`` uses the weights of the last ``PRELOAD`` before it (or those
  the window found).
* **Products.** A chain of ``MATMUL``\\ s into the same accumulator rows, one after the other
  (the tiles of a reduction), is one product: its activation rows side by side times its
  weight tiles stacked, in float32 blocks of at most 1024 terms, which is exact (every
  partial sum is an integer of magnitude at most ``1024 * 128 * 128 = 2**24``), the blocks
  summed as integers. Chains that read the same activation rows (other output columns) are
  one product with their weights side by side (:func:`_chain_products`).
* **Accumulator.** ``LOAD_ACC`` and an overwriting chain set rows, an accumulating chain adds
  to them and ``STORE`` / ``STORE_Q`` read them. Sorted by row, a row's value at any event is
  the last set before it (or the row as the window found it) plus the additions since, from
  one cumulative sum that wraps in INT32 as the accumulator does (:func:`_accumulate`).
* **Requantization.** ``STORE_Q`` uses the state of the last ``LOAD_QUANT`` before it; its
  rows go through :func:`sw.quant.requantize` / :func:`sw.quant.requantize_float` (each row
  with its own multipliers), grouped by mode, zero point and clamp.
* **DRAM.** The stores' rows are written in program order: at once when no two of them share
  a byte, else store by store through the handlers' writer.

``tb/test_model.py`` runs random programs both ways (windows and one instruction at a time)
and compares every architectural effect.
"""

import numpy as np
from amaranth.lib import data

from hw import isa
from hw.isa import ErrorCode, INSTR_BYTES, Opcode, QuantMode
from . import codec
from .quant import requantize, requantize_float


__all__ = ["DecodedProgram", "decode_program", "window_limit", "analyse_window", "run_window"]


_INSTRUCTION = data.Layout.cast(isa.Instruction)
_OPCODE_OFFSET = _INSTRUCTION["opcode"].offset
_OPCODE_MASK = (1 << _INSTRUCTION["opcode"].width) - 1
_ADDRESS_SPACE = 1 << 32

# The opcodes' byte values, which the decoded columns hold.
LOAD_SPAD, LOAD_ACC, PRELOAD, MATMUL, STORE, LOAD_QUANT, STORE_Q, END = (
    Opcode.LOAD_SPAD.value, Opcode.LOAD_ACC.value, Opcode.PRELOAD.value, Opcode.MATMUL.value,
    Opcode.STORE.value, Opcode.LOAD_QUANT.value, Opcode.STORE_Q.value, Opcode.END.value)
_LEGAL = np.zeros(1 << 8, dtype=bool)
_LEGAL[[opcode.value for opcode in Opcode]] = True
_SPECIAL = ~_LEGAL                  # where a window stops: END and the illegal opcodes
_SPECIAL[END] = True
assert _OPCODE_OFFSET % 8 == 0 and _OPCODE_MASK == 0xFF   # the opcode is a whole byte


def _field(opcode, name):
    for spec in codec.FIELDS[opcode]:
        if spec.name == name:
            return spec
    raise KeyError(name)


def _extract(raw, low, high, spec):
    """One field of every word, as int64: from the program's bytes (``raw``, 16 a word)
    where the field is whole bytes, else from the words' low and high 64-bit halves."""
    offset, width = spec.offset, spec.width
    if offset % 8 == 0 and width in (8, 16, 32):
        kind = f"<{'i' if spec.signed else 'u'}{width // 8}"
        view = np.ndarray((raw.size // INSTR_BYTES,), dtype=kind, buffer=raw,
                          offset=offset // 8, strides=(INSTR_BYTES,))
        return view.astype(np.int64)
    mask = np.uint64((1 << width) - 1)
    if offset >= 64:
        value = (high >> np.uint64(offset - 64)) & mask
    elif offset + width <= 64:
        value = (low >> np.uint64(offset)) & mask
    else:
        value = ((low >> np.uint64(offset)) | (high << np.uint64(64 - offset))) & mask
    value = value.astype(np.int64)
    if spec.signed:
        value = np.where(value >> (width - 1) != 0, value - (1 << width), value)
    return value


# The columns of a decoded program, from which opcode's field each is taken.
_COLUMNS = {
    "local": {LOAD_SPAD: "local_addr", LOAD_ACC: "local_addr", PRELOAD: "spad_addr",
              MATMUL: "spad_addr", STORE: "acc_addr", STORE_Q: "acc_addr"},
    "acc": {MATMUL: "acc_addr"},
    "rows": {LOAD_SPAD: "rows", LOAD_ACC: "rows", MATMUL: "rows", STORE: "rows",
             STORE_Q: "rows"},
    **{name: {LOAD_SPAD: name, LOAD_ACC: name, STORE: name, STORE_Q: name, LOAD_QUANT: name}
       for name in ("row_bytes", "dram_addr", "dram_stride")},
    **{name: {MATMUL: name} for name in ("accumulate", "k_width", "n_width")},
    **{name: {LOAD_QUANT: name} for name in ("zero_point", "mode", "act_min", "act_max")},
}


def _column_specs():
    """For each column: the fields it is taken from, each with the opcodes (a lookup table
    by opcode byte) that take it from there."""
    specs = {}
    for column, sources in _COLUMNS.items():
        parts = {}
        for opcode, name in sources.items():
            spec = _field(Opcode(opcode), name)
            chosen = parts.setdefault(spec, np.zeros(1 << 8, dtype=bool))
            chosen[opcode] = True
        specs[column] = tuple(parts.items())
    return specs


_COLUMN_SPECS = _column_specs()


class DecodedProgram:
    """Instructions ``start .. start + n - 1`` of a program, decoded into numpy columns.

    Attributes
    ----------
    start, n : int
    op : numpy.ndarray
        The raw opcode byte of each word (``uint8``).
    stop : int
        Index of the first word that is ``END`` or an illegal opcode (``n`` if none): no
        window reaches it.
    local, acc, rows, row_bytes, dram_addr, dram_stride, accumulate, k_width, n_width,
    zero_point, mode, act_min, act_max : numpy.ndarray
        ``int64`` operands, meaningful where the opcode has such a field (``local`` is the
        local row: ``local_addr``, ``spad_addr`` or for stores ``acc_addr``; ``acc`` is
        ``MATMUL``'s ``acc_addr``).
    """

    def __init__(self, start, raw):
        words = raw.view("<u8").reshape(-1, 2)
        self.start, self.n = start, len(words)
        low, high = words[:, 0], words[:, 1]
        self.op = ((low >> np.uint64(_OPCODE_OFFSET)) & np.uint64(_OPCODE_MASK)).astype(np.uint8)
        special = np.flatnonzero((self.op == END) | ~_LEGAL[self.op])
        self.stop = int(special[0]) if special.size else self.n
        extracted = {}
        for column, parts in _COLUMN_SPECS.items():
            # A column is read only for the opcodes that have the field: the others' entries
            # are left as whatever the first field's bits hold.
            value = None
            for spec, chosen in parts:
                if spec not in extracted:
                    extracted[spec] = _extract(raw, low, high, spec)
                value = extracted[spec] if value is None \
                    else np.where(chosen[self.op], extracted[spec], value)
            setattr(self, column, value)


def decode_program(dram, prog_addr, start, count):
    """Decode at most ``count`` words from instruction ``start`` of the program at
    ``prog_addr`` (all inside ``dram``): up to the first ``END`` or illegal opcode, found
    first from the opcode bytes alone."""
    first = prog_addr + INSTR_BYTES * start
    opcodes = dram[first + _OPCODE_OFFSET // 8:first + INSTR_BYTES * count:INSTR_BYTES]
    special = np.flatnonzero(_SPECIAL[opcodes])
    if special.size:
        count = int(special[0]) + 1
    return DecodedProgram(start, dram[first:first + INSTR_BYTES * count])


def window_limit(config, program, a, b, elements):
    """The end of the longest window from ``a`` (at most ``b``, at least one instruction)
    whose arrays hold at most about ``elements`` elements: a row event of the scratchpad
    costs a scratchpad row, one of the accumulator an accumulator row and its lanes."""
    op, rows = program.op[a:b], program.rows[a:b]
    spad = np.where((op == LOAD_SPAD) | (op == MATMUL), rows,
                    np.where(op == PRELOAD, config.rows, 0))
    acc = np.where((op == LOAD_ACC) | (op == MATMUL) | (op == STORE) | (op == STORE_Q), rows, 0)
    cost = np.cumsum(spad * config.spad_row_bytes + acc * 2 * config.acc_row_bytes)
    return a + max(1, int(np.searchsorted(cost, elements, side="right")))


# -- analysis -----------------------------------------------------------------------------------

class Window:
    """What :func:`analyse_window` found for instructions ``a .. b - 1`` of a decoded program.

    Attributes
    ----------
    end : int
        The window runs ``a .. end - 1``.
    fault : ErrorCode or None
        The error of instruction ``end`` when the window stops there because it fails.
    program_written : bool
        A store in the window may have written over words of the decoded program.
    quant : tuple
        ``(multipliers, shifts)``, ``int32`` of shape ``(loads, C)``: the rows of each
        ``LOAD_QUANT`` in ``a .. end - 1``.
    """

    def __init__(self, end, fault, program_written, quant):
        self.end, self.fault, self.program_written, self.quant = \
            end, fault, program_written, quant


def _block_end(addr, rows, stride, row_bytes):
    return addr + (rows - 1) * stride + row_bytes


def _gather(dram, starts, row_bytes, width):
    """``(n, width)`` ``uint8``: row ``i`` holds ``row_bytes[i]`` bytes of ``dram`` from
    ``starts[i]`` and zeros past them (every row inside ``dram``)."""
    lanes = np.arange(width)
    index = starts[:, None] + lanes
    if row_bytes.size and row_bytes.min() == width:
        return dram[index]
    inside = lanes < row_bytes[:, None]
    rows = dram[np.where(inside, index, 0)]
    rows[~inside] = 0
    return rows


def _quant_rows(config, dram, addr, stride, row_bytes):
    """The two rows of each ``LOAD_QUANT`` as ``int32`` lanes: ``(multipliers, shifts)``."""
    width = config.acc_row_bytes
    starts = np.concatenate([addr, addr + stride])
    rows = _gather(dram, starts, np.concatenate([row_bytes, row_bytes]), width)
    lanes = rows.view("<i4").astype(np.int32)
    count = len(addr)
    return lanes[:count], lanes[count:]


def _first(mask):
    found = np.flatnonzero(mask)
    return int(found[0]) if found.size else None


def _raw_hazard(load, load_low, load_high, store, store_low, store_high):
    """Index (into the window) of the first load whose block may overlap that of an earlier
    store, or ``None``."""
    if not store.size or not load.size:
        return None
    after = load > store[0]
    if not after.any():
        return None
    load, load_low, load_high = load[after], load_low[after], load_high[after]
    # The stores before each load, as a prefix of the stores in program order.
    before = np.searchsorted(store, load)
    low = np.minimum.accumulate(store_low)[before - 1]
    high = np.maximum.accumulate(store_high)[before - 1]
    suspect = np.flatnonzero((load_low < high) & (load_high > low))
    block = 256
    for first in range(0, suspect.size, block):
        chosen = suspect[first:first + block]
        overlap = ((store_low[None, :] < load_high[chosen, None])
                   & (store_high[None, :] > load_low[chosen, None])
                   & (store[None, :] < load[chosen, None])).any(axis=1)
        hit = _first(overlap)
        if hit is not None:
            return int(load[chosen[hit]])
    return None


def analyse_window(config, dram, program, prog_addr, a, b):
    """Where the window starting at instruction index ``a`` (of ``program``) ends, at most at
    ``b`` (``b <= program.stop``); see :class:`Window`."""
    span = slice(a, b)
    op = program.op[span]
    local, rows = program.local[span], program.rows[span]
    row_bytes, addr, stride = program.row_bytes[span], program.dram_addr[span], \
        program.dram_stride[span]
    n = b - a
    code = np.zeros(n, dtype=np.int64)

    def fail(condition, error):
        code[(code == 0) & condition] = error.value

    spad_width, acc_width = config.spad_row_bytes, config.acc_row_bytes
    is_spad_load, is_acc_load = op == LOAD_SPAD, op == LOAD_ACC
    is_preload, is_matmul = op == PRELOAD, op == MATMUL
    is_plain_store, is_quant_store, is_quant_load = op == STORE, op == STORE_Q, op == LOAD_QUANT
    is_load, is_store = is_spad_load | is_acc_load, is_plain_store | is_quant_store
    dma_rows = np.where(is_quant_load, 2, rows)
    end = _block_end(addr, dma_rows, stride, row_bytes)

    fail(is_spad_load & ((rows == 0) | (row_bytes == 0) | (row_bytes > spad_width)),
         ErrorCode.BAD_LENGTH)
    fail(is_acc_load & ((rows == 0) | (row_bytes == 0) | (row_bytes > acc_width)),
         ErrorCode.BAD_LENGTH)
    fail(is_spad_load & (local + rows > config.spad_depth), ErrorCode.SPAD_RANGE)
    fail(is_acc_load & (local + rows > config.acc_depth), ErrorCode.ACC_RANGE)
    fail(is_preload & (local + config.rows > config.spad_depth), ErrorCode.SPAD_RANGE)
    fail(is_matmul & ((rows == 0) | (program.k_width[span] > config.rows)
                  | (program.n_width[span] > config.cols)), ErrorCode.BAD_LENGTH)
    fail(is_matmul & (local + rows > config.spad_depth), ErrorCode.SPAD_RANGE)
    fail(is_matmul & (program.acc[span] + rows > config.acc_depth), ErrorCode.ACC_RANGE)
    fail(is_plain_store & ((rows == 0) | (row_bytes == 0) | (row_bytes % 4 != 0)
                  | (row_bytes > acc_width)), ErrorCode.BAD_LENGTH)
    fail(is_quant_store & ((rows == 0) | (row_bytes == 0) | (row_bytes > config.cols)),
         ErrorCode.BAD_LENGTH)
    fail(is_store & (local + rows > config.acc_depth), ErrorCode.ACC_RANGE)
    fail(is_quant_load & ((row_bytes == 0) | (row_bytes % 4 != 0) | (row_bytes > acc_width)),
         ErrorCode.BAD_LENGTH)
    dma = is_load | is_store | is_quant_load
    fail(dma & (end > _ADDRESS_SPACE), ErrorCode.DRAM_RANGE)
    fail((is_load | is_quant_load) & (end > dram.size), ErrorCode.BUS_READ)
    fail(is_store & (end > dram.size), ErrorCode.BUS_WRITE)

    quant_loads = np.flatnonzero(is_quant_load & (code == 0))
    cols = config.cols
    multipliers = np.zeros((quant_loads.size, cols), dtype=np.int32)
    shifts = np.zeros((quant_loads.size, cols), dtype=np.int32)
    if quant_loads.size:
        multipliers, shifts = _quant_rows(config, dram, addr[quant_loads],
                                          stride[quant_loads], row_bytes[quant_loads])
        zero_point = program.zero_point[span][quant_loads]
        float_mode = program.mode[span][quant_loads] == QuantMode.FLOAT.value
        bad = np.where(float_mode,
                       ~np.isfinite(multipliers.view(np.float32)).all(axis=1)
                       | (shifts != 0).any(axis=1),
                       ((shifts < -31) | (shifts > 31)).any(axis=1))
        bad |= (zero_point < -128) | (zero_point > 127)
        bad |= program.act_min[span][quant_loads] > program.act_max[span][quant_loads]
        quant_fault = np.zeros(n, dtype=bool)
        quant_fault[quant_loads] = bad
        fail(quant_fault, ErrorCode.QUANT)

    failing = _first(code != 0)
    limit = n if failing is None else failing

    # Hazards through the DRAM: loads up to the failing instruction (whose QUANT check read
    # the DRAM) after stores before it.
    reach = min(limit + 1, n)
    loads = np.flatnonzero((is_load | is_quant_load)[:reach])
    stores = np.flatnonzero(is_store[:limit])
    window_end, fault, program_written = limit, None, False
    if failing is not None:
        fault = ErrorCode(int(code[failing]))
    if stores.size:
        cut = _raw_hazard(loads, addr[loads], end[loads], stores, addr[stores], end[stores])
        # A store over words of the program still to be fetched ends the window after it.
        first_word = prog_addr + INSTR_BYTES * (program.start + a + stores + 1)
        last_word = prog_addr + INSTR_BYTES * (program.start + program.n)
        over = _first((addr[stores] < last_word) & (end[stores] > first_word))
        if over is not None and (cut is None or int(stores[over]) + 1 <= cut):
            cut, program_written = int(stores[over]) + 1, True
        if cut is not None and cut <= limit:
            window_end, fault = cut, None
    kept = np.searchsorted(quant_loads, window_end)
    return Window(a + window_end, fault, program_written,
                  (multipliers[:kept], shifts[:kept]))


# -- execution ----------------------------------------------------------------------------------

def _distinct(values):
    """The distinct values of a one-dimensional array, sorted."""
    values = np.sort(values)
    keep = np.ones(values.size, dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep]


def _expand(count):
    """Row events of instructions with ``count`` rows each: each event's instruction and its
    row within it."""
    total = int(count.sum())
    instruction = np.repeat(np.arange(count.size), count)
    first = np.cumsum(count) - count
    return instruction, np.arange(total) - first[instruction]


def _rows_of(dram, starts, row_bytes, width, out=None):
    """Like :func:`_gather` (into ``out`` if given), faster: the DRAM seen as ``width``-byte
    items from each offset that the rows start at modulo ``width``, one item taken per row."""
    count = starts.size
    rows = np.empty((count, width), dtype=np.uint8) if out is None else out
    if not count:
        return rows
    items = rows.view(f"V{width}").reshape(count)
    offset = starts % width
    near_end = starts > dram.size - width
    offsets = _distinct(offset)
    if offsets.size == 1 and not near_end.any():
        first = int(offsets[0])
        view = dram[first:first + (dram.size - first) // width * width].view(f"V{width}")
        np.take(view, starts // width, out=items, mode="clip")
        chosen_offsets = ()
    else:
        chosen_offsets = offsets.tolist()
    for first in chosen_offsets:
        chosen = (offset == first) & ~near_end
        view = dram[first:first + (dram.size - first) // width * width].view(f"V{width}")
        items[chosen] = np.take(view, starts[chosen] // width)
    if near_end.any():
        rows[near_end] = _gather(dram, starts[near_end], row_bytes[near_end], width)
    short = row_bytes < width
    if short.any():
        rows[(np.arange(width) >= row_bytes[:, None]) & short[:, None]] = 0
    return rows


def _scratchpad(model, dram, op, local, rows, addr, stride, row_bytes):
    """The scratchpad side of a window: the rows every ``PRELOAD`` and ``MATMUL`` reads.

    Returns ``(found, reads, rows_of, block_of)``: ``found`` stacks the rows the window's
    ``LOAD_SPAD``\\ s write (in program order) and then the scratchpad as the window found
    it; ``reads`` lists the reading instructions (window indices, program order);
    ``rows_of(read, row)`` gives the rows of ``found`` that reads ``read`` (indices into
    ``reads``, broadcast against ``row``) see as their rows ``row``; ``block_of(read)`` is
    ``b`` where that is ``b + row``, else -1. The model's scratchpad is left as the window
    leaves it.

    The first and last rows of every load and read cut the scratchpad into segments, each
    of which every instruction writes or reads whole. A write or a read of a segment is an
    event; sorted by segment (numpy's stable radix sort: program order within a segment), a
    running maximum names the load that a read of a segment sees last (or none: the rows as
    the window found them). A read whose segments all lie at the same distance from their
    rows in ``found`` (one load, or loads of consecutive rows one after the other) reads a
    block of it; another one (rare: a weight tile that its last load wrote only in part) is
    resolved row by row.
    """
    config = model.config
    depth, R = config.spad_depth, config.rows
    spad_loads = np.flatnonzero(op == LOAD_SPAD)
    load_local, load_rows = local[spad_loads], rows[spad_loads]
    load_first = np.cumsum(load_rows) - load_rows          # each load's first row in `written`
    write_inst, write_row = _expand(load_rows)
    count = write_inst.size
    found = np.empty((count + depth, config.spad_row_bytes), dtype=np.uint8)
    load_addr, load_stride = addr[spad_loads], stride[spad_loads]
    written = _rows_of(dram, load_addr[write_inst] + write_row * load_stride[write_inst],
                       row_bytes[spad_loads][write_inst], config.spad_row_bytes,
                       out=found[:count])
    found[count:] = model.spad

    touch = np.flatnonzero((op == LOAD_SPAD) | (op == PRELOAD) | (op == MATMUL))
    touch_rows = np.where(op[touch] == PRELOAD, R, rows[touch])
    start = local[touch]
    cut = np.zeros(depth + 1, dtype=bool)
    cut[start] = True
    cut[start + touch_rows] = True
    segment = np.cumsum(cut[:depth]) - 1              # each row's segment
    segment_start = np.flatnonzero(cut[:depth])
    first_segment = segment[start]
    segments = segment[start + touch_rows - 1] - first_segment + 1
    event, part = _expand(segments)
    key = first_segment[event] + part
    is_write = op[touch][event] == LOAD_SPAD
    # A write event's load, as an index into `spad_loads`.
    writer = (np.cumsum(op[touch] == LOAD_SPAD) - 1)[event]
    order = np.argsort(key.astype(np.uint16), kind="stable")
    index = np.arange(order.size)
    last = np.maximum.accumulate(np.where(is_write[order], index, -1))
    sorted_key = key[order]
    seen = (last >= 0) & (np.take(sorted_key, np.maximum(last, 0)) == sorted_key)
    sees = np.empty(order.size, dtype=np.int64)       # the load each event sees, or -1
    sees[order] = np.where(seen, writer[order[np.maximum(last, 0)]], -1)
    # Where an event finds its rows: row x at `found[x + shift]`.
    load = np.maximum(sees, 0)
    shift = np.where(sees >= 0, load_first[load] - load_local[load], count) \
        if spad_loads.size else \
        np.full(sees.size, count, dtype=np.int64)

    is_read = op[touch] != LOAD_SPAD
    reads = touch[is_read]
    read_start = start[is_read]
    read_shift = shift[~is_write]
    read_count = segments[is_read]
    read_first = np.cumsum(read_count) - read_count    # each read's first segment event
    if reads.size:
        low = np.minimum.reduceat(read_shift, read_first)
        high = np.maximum.reduceat(read_shift, read_first)
    else:
        low = high = read_shift
    base = read_start + low
    mixed = low != high             # segments found in different places: row by row

    def rows_of(read, row):
        index = base[read] + row
        if mixed.any():
            odd = np.broadcast_to(mixed[read], index.shape)
            if odd.any():
                where = np.nonzero(odd)
                read = np.broadcast_to(read, index.shape)[where]
                x = read_start[read] + np.broadcast_to(row, index.shape)[where]
                index[where] = x + read_shift[read_first[read] + segment[x]
                                              - segment[read_start[read]]]
        return index

    def block_of(read):
        return np.where(mixed[read], -1, base[read])

    # The scratchpad as the window leaves it: each segment's last load, if any.
    ends = _group_ends(sorted_key) & seen
    if ends.any():
        final = writer[order[last[ends]]]
        chosen = sorted_key[ends]
        first_row = segment_start[chosen]
        size = np.append(segment_start, depth)[chosen + 1] - first_row
        piece, offset = _expand(size)
        x = first_row[piece] + offset
        load = final[piece]
        model.spad[x] = np.take(written, load_first[load] + x - load_local[load], axis=0)
    return found, reads, rows_of, block_of


def _group_ends(sorted_key):
    ends = np.ones(sorted_key.size, dtype=bool)
    ends[:-1] = sorted_key[1:] != sorted_key[:-1]
    return ends


def _chains(acc_op, acc_base, acc_rows, accumulate):
    """Chains of ``MATMUL``\\ s over the same accumulator rows: a ``MATMUL`` that adds to the
    rows of the accumulator instruction just before it, itself a ``MATMUL`` with the same
    ``acc_addr`` and ``rows``, joins its chain. Returns each instruction's chain (chains
    numbered in program order) and whether it starts one."""
    is_matmul = acc_op == MATMUL
    follows = np.zeros(acc_op.size, dtype=bool)
    follows[1:] = (is_matmul[1:] & is_matmul[:-1] & accumulate[1:]
                   & (acc_base[1:] == acc_base[:-1]) & (acc_rows[1:] == acc_rows[:-1]))
    head = ~follows
    return np.cumsum(head) - 1, head


def _chain_products(config, activations, weights, mm_rows, mm_weight, mm_chain, rows_of,
                    block):
    """``(rows, C)`` INT32 per chain of ``MATMUL``\\ s (consecutive in ``mm_chain``), stacked
    in chain order: the sum over the chain's ``MATMUL``\\ s of their activation rows times
    their weights, wrapped to INT32.

    ``activations`` holds rows of ``R`` INT8 activations and ``weights`` the weight tiles
    (``(tiles, R, C)``, float32); ``MATMUL`` ``m`` uses tile ``mm_weight[m]`` and
    reads as its rows ``t`` the rows ``rows_of(m, t)`` of ``activations``, which are
    ``block[m] + t`` where ``block[m]`` is not -1.
    """
    R, C = config.rows, config.cols
    head = np.ones(mm_chain.size, dtype=bool)
    head[1:] = mm_chain[1:] != mm_chain[:-1]
    starts = np.flatnonzero(head)
    length = np.empty_like(starts)
    length[:-1] = starts[1:] - starts[:-1]
    length[-1:] = mm_chain.size - starts[-1:]
    rows = mm_rows[starts]
    out_first = np.cumsum(rows) - rows                    # each chain's first output row
    out = np.empty((int(rows.sum()), C), dtype=np.int32)
    shape = rows << 32 | length
    zero = None
    if _distinct(shape).size > 32:
        # Many shapes: round rows and lengths up to powers of two; padding rows repeat the
        # last row (their results are dropped), padding members multiply by zero weights.
        padded_rows = 1 << np.ceil(np.log2(rows)).astype(np.int64)
        padded_length = 1 << np.ceil(np.log2(length)).astype(np.int64)
        shape = padded_rows << 32 | padded_length
        zero = weights.shape[0]                           # an all-zero weight tile
        weights = np.concatenate([weights, np.zeros((1, R, C), dtype=weights.dtype)])
    shapes, group = np.unique(shape, return_inverse=True)
    group = group.reshape(-1)
    for index, packed in enumerate(shapes.tolist()):
        size, members = packed >> 32, packed & 0xFFFF_FFFF
        chosen = np.flatnonzero(group == index)
        member = starts[chosen, None] + np.arange(members)                 # (G, k)
        real = member < (starts[chosen] + length[chosen])[:, None]
        member = np.where(real, member, starts[chosen, None])
        tile = mm_weight[member] if zero is None else np.where(real, mm_weight[member], zero)
        lanes = np.arange(size)
        row = np.minimum(lanes, rows[chosen, None] - 1)                    # (G, r)
        # Chains that read the same rows (another tile of output columns, say) share one
        # product, with their weights side by side.
        first_rows = block[member]
        if (first_rows >= 0).all():
            key = np.ascontiguousarray(np.concatenate([first_rows, rows[chosen, None]], axis=1))
            _, share = np.unique(key.view(f"V{key.shape[1] * 8}").reshape(-1),
                                 return_inverse=True)
            share = share.reshape(-1)
        else:
            share = np.arange(chosen.size)
        by_share = np.argsort(share, kind="stable")
        counts = np.bincount(share)
        share_first = np.cumsum(counts) - counts
        for width in _distinct(counts).tolist():
            together = by_share[share_first[counts == width][:, None] + np.arange(width)]
            lead = together[:, 0]                                           # (U, m) -> (U,)
            if (first_rows >= 0).all():
                index_rows = first_rows[lead][:, None, :] + row[lead][:, :, None]  # (U, r, k)
            else:
                index_rows = rows_of(member[lead][:, None, :], row[lead][:, :, None])
            a = np.take(activations, index_rows, axis=0).reshape(lead.size, size, members * R) \
                .astype(np.float32)
            w = np.take(weights, tile[together], axis=0)                    # (U, m, k, R, C)
            w = w.transpose(0, 2, 3, 1, 4).reshape(lead.size, members * R, width * C)
            product = _exact_matmul(a, w, R)                                # (U, r, m C)
            product = product.reshape(lead.size, size, width, C).transpose(0, 2, 1, 3)
            product = product.reshape(-1, size, C)                          # (U m, r, C)
            chains = together.reshape(-1)
            target = out_first[chosen[chains], None] + lanes
            valid = lanes < rows[chosen[chains], None]
            if valid.all():
                out[target] = product
            else:
                out[target[valid]] = product[valid]
    return out


def _exact_matmul(a, b, R):
    """``a @ b`` for float32 stacks holding INT8 values, as INT32 (wrapping). Exact: the
    reduction is cut into blocks of at most 1024 terms, in which every partial sum is an
    integer of magnitude at most ``1024 * 128 * 128 = 2**24``, and so exact in float32; the
    blocks are summed as integers."""
    depth = a.shape[-1]
    step = max(R, 1024 // R * R)
    if depth <= step:
        return np.matmul(a, b).astype(np.int32)
    total = np.zeros(a.shape[:-1] + b.shape[-1:], dtype=np.int64)
    for first in range(0, depth, step):
        total += np.matmul(a[..., first:first + step], b[..., first:first + step, :]) \
            .astype(np.int64)
    return total.astype(np.int32)


def _requantized(values, state, rows_state):
    """``STORE_Q``'s INT8 rows: ``values`` (INT32 rows), row ``i`` with the requantization
    state ``rows_state[i]`` of ``state`` (stacked: mode, multipliers, shifts, zero point,
    clamp)."""
    modes, multipliers, shifts, zero_points, act_mins, act_maxs = state
    out = np.empty(values.shape, dtype=np.int8)
    # One key per state: mode (1 bit), zero point (15 bits), clamp (8 + 8 bits).
    keys = (((modes << 16 | (zero_points & 0xFFFF)) << 8 | (act_mins & 0xFF)) << 8
            | (act_maxs & 0xFF))
    unique, group = np.unique(keys[rows_state], return_inverse=True)
    group = group.reshape(-1)
    for index in range(unique.size):
        chosen = np.flatnonzero(group == index) if unique.size > 1 \
            else np.arange(values.shape[0])
        which = rows_state[chosen]
        one = which[0]
        mode, zero_point, act_min, act_max = (int(modes[one]), int(zero_points[one]),
                                              int(act_mins[one]), int(act_maxs[one]))
        flat = values[chosen].reshape(1, -1)
        if mode == QuantMode.FLOAT.value:
            result = requantize_float(flat, multipliers[which].view(np.float32).reshape(-1),
                                      zero_point, act_min, act_max)
        else:
            result = requantize(flat, multipliers[which].reshape(-1),
                                shifts[which].reshape(-1), zero_point, act_min, act_max)
        out[chosen] = result.reshape(-1, values.shape[1])
    return out


def _write_stores(dram, data, row_start, row_bytes, instructions):
    """Write the stores' rows (``data``, ``uint8``, one row per DRAM row, in program order)
    to the DRAM; ``instructions`` lists each store's ``(first data row, rows, row_bytes,
    dram_addr, dram_stride)``."""
    # No two rows share a byte when, in address order, each ends before the next starts.
    order = np.argsort(row_start, kind="stable")
    if np.all(row_start[order][:-1] + row_bytes[order][:-1] <= row_start[order][1:]):
        width = data.shape[1]
        lanes = np.arange(width)
        index = row_start[:, None] + lanes
        inside = lanes < row_bytes[:, None]
        dram[index[inside]] = data[inside]
        return
    from .model import _write_rows
    for first, count, nbytes_one, addr_one, stride_one in instructions:
        _write_rows(dram, data[first:first + count, :nbytes_one], addr_one, stride_one)


def run_window(model, dram, program, a, window):
    """Run instructions ``a .. window.end - 1`` of ``program`` on ``model`` (a
    :class:`sw.model.ModelNPU`): the window :func:`analyse_window` found, which none of them
    fails."""
    config = model.config
    span = slice(a, window.end)
    op = program.op[span]
    local, rows = program.local[span], program.rows[span]
    row_bytes, addr, stride = program.row_bytes[span], program.dram_addr[span], \
        program.dram_stride[span]
    R, C = config.rows, config.cols
    quant_fields = _quant_fields(program, span, op)

    # Scratchpad: writes by LOAD_SPAD, reads by PRELOAD and MATMUL, in program order.
    found, reads, rows_of, block_of = _scratchpad(model, dram, op, local, rows, addr,
                                                  stride, row_bytes)

    # Weights: each PRELOAD's rows; each MATMUL takes the last PRELOAD's before it (0: the
    # weights the window found).
    read_op = op[reads]
    preloads = np.flatnonzero(read_op == PRELOAD)
    preload_rows = np.take(found, rows_of(preloads[:, None], np.arange(R)), axis=0)[:, :, :C]
    weights = np.concatenate([model.weights[None], preload_rows.view(np.int8)])
    if preloads.size:
        model.weights = weights[-1].copy()

    # Accumulator: sets by LOAD_ACC and overwriting MATMULs, additions by accumulating MATMULs,
    # reads by STORE and STORE_Q, in program order; a chain of MATMULs over the same rows
    # counts as one set or addition, of the chain's sum.
    acc_inst = np.flatnonzero((op == LOAD_ACC) | (op == MATMUL) | (op == STORE) | (op == STORE_Q))
    if not acc_inst.size:
        _finish_quant(model, window, quant_fields)
        return
    acc_op = op[acc_inst]
    acc_base = np.where(acc_op == MATMUL, program.acc[span][acc_inst], local[acc_inst])
    acc_rows = rows[acc_inst]
    accumulate = program.accumulate[span][acc_inst] != 0
    chain, head = _chains(acc_op, acc_base, acc_rows, accumulate)
    head_inst, head_op = acc_inst[head], acc_op[head]
    event, event_row = _expand(acc_rows[head])
    event_op = head_op[event]
    key = acc_base[head][event] + event_row
    values = np.zeros((key.size, C), dtype=np.int32)
    is_acc_load, is_matmul = event_op == LOAD_ACC, event_op == MATMUL
    if is_acc_load.any():
        loaded = head_inst[event[is_acc_load]]
        values[is_acc_load] = _rows_of(dram, addr[loaded] + event_row[is_acc_load] * stride[loaded],
                                 row_bytes[loaded], config.acc_row_bytes).view("<i4")
    if is_matmul.any():
        is_matmul_inst = acc_op == MATMUL
        matmuls = np.flatnonzero(read_op == MATMUL)
        values[is_matmul] = _chain_products(
            config, found[:, :R].view(np.int8),
            weights.astype(np.float32), acc_rows[is_matmul_inst],
            np.cumsum(op == PRELOAD)[acc_inst[is_matmul_inst]], chain[is_matmul_inst],
            lambda member, row: rows_of(matmuls[member], row), block_of(matmuls))
    head_accumulate = accumulate[head][event]
    is_add = is_matmul & head_accumulate
    is_set = is_acc_load | (is_matmul & ~head_accumulate)
    is_read = ~(is_add | is_set)
    read_value = _accumulate(model, key, values, is_set, is_add, is_read)

    if read_value is not None:
        # Stores, in program order: STORE's bytes, STORE_Q's requantized lanes.
        store_inst = head_inst[(head_op == STORE) | (head_op == STORE_Q)]
        store_rows = rows[store_inst]
        read_op = event_op[is_read]
        data = np.zeros((read_value.shape[0], config.acc_row_bytes), dtype=np.uint8)
        st = read_op == STORE
        if st.any():
            data[st] = read_value[st].view(np.uint8)
        sq = ~st
        if sq.any():
            state = _quant_state(model, window, quant_fields)
            quant_before = np.cumsum(op == LOAD_QUANT)[store_inst]
            read_inst = np.repeat(np.arange(store_inst.size), store_rows)
            data[sq, :C] = _requantized(read_value[sq], state,
                                        quant_before[read_inst[sq]]).view(np.uint8)
        _, read_row = _expand(store_rows)
        read_inst = np.repeat(store_inst, store_rows)
        first = np.cumsum(store_rows) - store_rows
        instructions = list(zip(first.tolist(), store_rows.tolist(),
                                row_bytes[store_inst].tolist(), addr[store_inst].tolist(),
                                stride[store_inst].tolist()))
        _write_stores(dram, data, addr[read_inst] + read_row * stride[read_inst],
                      row_bytes[read_inst], instructions)
    _finish_quant(model, window, quant_fields)


def _accumulate(model, key, values, is_set, is_add, is_read):
    """Apply accumulator events (rows ``key`` in program order; ``values`` of the sets and
    additions) to ``model.acc``; returns the read events' values in program order (``None``
    if there are none)."""
    order = np.argsort(key.astype(np.uint16), kind="stable")
    sorted_key = key[order]
    values_sorted = np.take(values, order, axis=0)
    setting = is_set[order]
    additions = np.where(is_add[order][:, None], values_sorted, 0)
    total = np.cumsum(additions, axis=0, dtype=np.int32)      # wraps, as the hardware adds
    index = np.arange(key.size)
    group_start = np.ones(key.size, dtype=bool)
    group_start[1:] = sorted_key[1:] != sorted_key[:-1]
    anchor = np.maximum.accumulate(np.where(setting | group_start, index, 0))
    anchored_set = setting[anchor]
    # A row's value: its last set (or the row as the window found it), plus the additions
    # since.
    base = np.where(anchored_set[:, None], np.take(values_sorted, anchor, axis=0),
                    np.take(model.acc, np.take(sorted_key, anchor), axis=0))
    total_anchor = np.take(total, anchor, axis=0)
    before = np.where(anchored_set[:, None], total_anchor,
                      total_anchor - np.take(additions, anchor, axis=0))
    value_sorted = base - before + total
    ends = _group_ends(sorted_key)
    model.acc[sorted_key[ends]] = value_sorted[ends]
    if not is_read.any():
        return None
    value = np.empty_like(value_sorted)
    value[order] = value_sorted
    return value[is_read]


def _quant_fields(program, span, op):
    """The operands of the window's ``LOAD_QUANT``\\ s, in program order."""
    chosen = np.flatnonzero(op == LOAD_QUANT)
    return {name: getattr(program, name)[span][chosen]
            for name in ("mode", "zero_point", "act_min", "act_max")}


def _quant_state(model, window, fields):
    """The requantization states a window's ``STORE_Q``\\ s may use, stacked: the model's
    (index 0), then each ``LOAD_QUANT``'s."""
    multipliers, shifts = window.quant
    return (np.concatenate([[model.quant_mode.value], fields["mode"]]),
            np.concatenate([model.multipliers[None], multipliers]),
            np.concatenate([model.shifts[None], shifts]),
            np.concatenate([[model.zero_point], fields["zero_point"]]),
            np.concatenate([[model.act_min], fields["act_min"]]),
            np.concatenate([[model.act_max], fields["act_max"]]))


def _finish_quant(model, window, fields):
    """The requantization state as the window's last ``LOAD_QUANT`` leaves it."""
    multipliers, shifts = window.quant
    if not multipliers.shape[0]:
        return
    model.quant_mode = QuantMode(int(fields["mode"][-1]))
    model.multipliers = multipliers[-1].copy()
    model.shifts = shifts[-1].copy()
    model.zero_point = int(fields["zero_point"][-1])
    model.act_min = int(fields["act_min"][-1])
    model.act_max = int(fields["act_max"][-1])
