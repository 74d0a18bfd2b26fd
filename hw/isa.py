"""The instruction set, error codes and host register map: one definition for ``hw`` and ``sw``.

The controller decodes :class:`Instruction` with these very layouts, and the compiler encodes
with them (``Instruction.const({...}).as_bits()``), so there is exactly one encoding.

An instruction is 128 bits, stored little-endian in DRAM as 16 bytes. Programs start at a
16-byte aligned address and run until ``END`` (or until the error that stops them).
"""

from types import MappingProxyType

from amaranth.hdl import Shape, signed
from amaranth.lib import data, enum


__all__ = [
    "Opcode", "QuantMode", "LoadArgs", "StoreArgs", "QuantArgs", "PreloadArgs", "MatmulArgs",
    "Arguments", "Instruction",
    "INSTR_BITS", "INSTR_BYTES", "OPTIONAL_FIELDS", "ErrorCode", "Reg", "MAGIC", "VERSION",
    "PERF_COUNTERS", "Status", "Control", "Irq", "WATCHDOG_RESET", "argument_layout", "encode",
    "decode", "opcode_of",
]


class Opcode(enum.Enum, shape=8):
    """What an instruction does. Zero is deliberately not an opcode: zeroed memory is illegal."""
    END       = 0x01  #: Stop; the program is done.
    LOAD_SPAD = 0x02  #: DRAM -> scratchpad rows (INT8, zero-filled past ``row_bytes``).
    LOAD_ACC  = 0x03  #: DRAM -> accumulator rows (INT32 little-endian, zero-filled).
    PRELOAD   = 0x04  #: Scratchpad rows ``spad_addr .. spad_addr+R-1`` -> shadow weights.
    MATMUL    = 0x05  #: Stream scratchpad rows through the array into the accumulator.
    STORE     = 0x06  #: Accumulator rows -> DRAM (INT32 little-endian).
    LOAD_QUANT = 0x07  #: DRAM -> per-channel requantization parameters (and zero point, clamp).
    STORE_Q   = 0x08  #: Accumulator rows -> requantized INT8 -> DRAM.


class QuantMode(enum.IntEnum, shape=1):
    """How ``STORE_Q`` requantizes, set per layer by ``LOAD_QUANT`` (``docs/quantization.md``)."""
    FIXED = 0  #: TFLite/gemmlowp integer arithmetic: INT32 multipliers and shifts.
    FLOAT = 1  #: onnxruntime's float32 arithmetic: one float32 scale per channel.


class LoadArgs(data.Struct):
    """``LOAD_SPAD`` / ``LOAD_ACC``: a 2-D strided block from DRAM into local rows.

    Row ``r`` (``0 <= r < rows``) is ``row_bytes`` bytes at ``dram_addr + r * dram_stride``;
    it lands in local row ``local_addr + r``, and the rest of that local row is zero.
    """
    local_addr:  16
    rows:        16
    row_bytes:   16
    dram_addr:   32
    dram_stride: 32


class StoreArgs(data.Struct):
    """``STORE``: the first ``row_bytes`` bytes (a multiple of 4) of each accumulator row
    ``acc_addr + r`` go to ``dram_addr + r * dram_stride``."""
    acc_addr:    16
    rows:        16
    row_bytes:   16
    dram_addr:   32
    dram_stride: 32


class QuantArgs(data.Struct):
    """``LOAD_QUANT``: the requantization state used by ``STORE_Q``.

    ``row_bytes`` (a multiple of 4, at most 4C) bytes are read of two DRAM rows, lane ``j``
    at byte ``4j``, little-endian; the lanes past them get 0 in both rows. In ``mode``
    :attr:`QuantMode.FIXED` row 0 at ``dram_addr`` holds the C INT32 multipliers, row 1 at
    ``dram_addr + dram_stride`` the C INT32 shifts (positive: right shift, negative: left
    shift, within -31 .. 31). In :attr:`QuantMode.FLOAT` row 0 holds the C float32 scales
    (their IEEE-754 bit patterns, finite: NaN and infinity are ``QUANT`` errors) and row 1
    is reserved: it must be all zero. The output zero point (-128 .. 127) and the clamp
    (``act_min <= act_max``) are operands. ``mode`` may be left out of :func:`encode`
    (fixed point).
    """
    dram_addr:   32
    dram_stride: 32
    row_bytes:   16
    zero_point:  signed(15)
    mode:        QuantMode
    act_min:     signed(8)
    act_max:     signed(8)


class PreloadArgs(data.Struct):
    """``PRELOAD``: scratchpad row ``spad_addr + i`` holds weight row ``i`` (lanes ``0..C-1``)
    for ``0 <= i < R``. The weights go to the shadow registers; the next ``MATMUL`` uses them."""
    spad_addr: 16


class MatmulArgs(data.Struct):
    """``MATMUL``: for ``0 <= t < rows``, activation row ``spad[spad_addr + t]`` (lanes
    ``0..R-1``) times the weights gives C INT32 results that overwrite (``accumulate = 0``)
    or add to (``accumulate = 1``) accumulator row ``acc_addr + t``.

    ``k_width`` and ``n_width`` (0 meaning R and C) say how many activation lanes and weight
    columns hold real operands, for the ``PERF_USEFUL_MACS`` counter; they change nothing
    else, and more than R or C is ``BAD_LENGTH``. They may be left out of :func:`encode`.
    """
    spad_addr:  16
    acc_addr:   16
    rows:       16
    accumulate: 1
    k_width:    9
    n_width:    9


class Arguments(data.Union):
    """The operands of an instruction; which member is meant depends on the opcode."""
    load:    LoadArgs
    store:   StoreArgs
    quant:   QuantArgs
    preload: PreloadArgs
    matmul:  MatmulArgs
    raw:     112


class Instruction(data.Struct):
    opcode:   8   # an :class:`Opcode` value; kept as raw bits so illegal values can be seen
    reserved: 8
    args:     Arguments


INSTR_BITS = data.Layout.cast(Instruction).size
INSTR_BYTES = INSTR_BITS // 8
assert INSTR_BITS == 128


_ARG_FIELD = {
    Opcode.LOAD_SPAD: "load",
    Opcode.LOAD_ACC:  "load",
    Opcode.STORE:     "store",
    Opcode.STORE_Q:   "store",
    Opcode.LOAD_QUANT: "quant",
    Opcode.PRELOAD:   "preload",
    Opcode.MATMUL:    "matmul",
}


#: Fields that :func:`encode` (and :func:`sw.codec.encode`) set to 0 when they are left out.
OPTIONAL_FIELDS = frozenset({"k_width", "n_width", "mode"})


def argument_layout(opcode):
    """The :class:`data.StructLayout` of ``opcode``'s operands, or ``None`` if it has none."""
    opcode = Opcode(opcode)
    if opcode not in _ARG_FIELD:
        return None
    return data.Layout.cast(data.Layout.cast(Arguments)[_ARG_FIELD[opcode]].shape)


def encode(opcode, **fields):
    """Encode one instruction into its 128-bit integer, through the :class:`Instruction` layout.

    >>> hex(encode(Opcode.END))
    '0x1'
    """
    opcode = Opcode(opcode)
    value = {"opcode": opcode.value}
    if opcode in _ARG_FIELD:
        layout = argument_layout(opcode)
        names = {name for name, _ in layout}
        fields = {**{name: 0 for name in names & OPTIONAL_FIELDS}, **fields}
        if set(fields) != names:
            raise ValueError(f"{opcode.name} takes the fields {sorted(names)}, "
                             f"not {sorted(fields)}")
        for name, field in layout:
            shape = Shape.cast(field.shape)
            low, high = (-(1 << (field.width - 1)), 1 << (field.width - 1)) if shape.signed \
                else (0, 1 << field.width)
            if not low <= fields[name] < high:
                raise ValueError(f"{opcode.name}.{name} must be within {low} .. {high - 1}, "
                                 f"not {fields[name]!r}")
        value["args"] = {_ARG_FIELD[opcode]: fields}
    elif fields:
        raise ValueError(f"{opcode.name} takes no fields, not {sorted(fields)}")
    return Instruction.const(value).as_bits()


def opcode_of(word):
    """The :class:`Opcode` of a 128-bit instruction word, or ``None`` if it is illegal."""
    raw = Instruction.from_bits(word).opcode
    try:
        return Opcode(raw)
    except ValueError:
        return None


def decode(word):
    """Decode a 128-bit instruction word into ``(opcode, fields)``; ``opcode`` is ``None``
    for an illegal opcode (and ``fields`` is then empty)."""
    view = Instruction.from_bits(word)
    opcode = opcode_of(word)
    if opcode not in _ARG_FIELD:
        return opcode, {}
    args = getattr(view.args, _ARG_FIELD[opcode])
    return opcode, {name: int(getattr(args, name)) for name, _ in args.shape()}


class ErrorCode(enum.Enum, shape=8):
    """Why a program stopped with an error (the ``STATUS.error_code`` field)."""
    NONE           = 0
    ILLEGAL_OPCODE = 1   #: the opcode is not one of :class:`Opcode`
    SPAD_RANGE     = 2   #: a scratchpad row outside ``0 .. spad_depth-1``
    ACC_RANGE      = 3   #: an accumulator row outside ``0 .. acc_depth-1``
    BAD_LENGTH     = 4   #: zero rows, zero bytes, or more bytes than a row holds
    BUS_READ       = 5   #: a DMA or instruction read answered SLVERR or DECERR
    BUS_WRITE      = 6   #: a DMA write answered SLVERR or DECERR
    PROGRAM        = 7   #: program address unaligned, length zero, or no END within length
    DRAM_RANGE     = 8   #: a DMA block that runs past the top of the 32-bit address space
    QUANT          = 9   #: zero point outside -128..127, act_min > act_max, |shift| > 31,
                         #: or in float mode a NaN or infinite scale or a non-zero row 1
    START_BUSY     = 10  #: the host wrote start while a program ran; it stops before its next
                         #: instruction (``ERROR_PC`` is that instruction's index)
    BUS_TIMEOUT    = 11  #: the AXI4 master waited ``Reg.WATCHDOG`` cycles on the slave with no
                         #: answer; the run ends at once, its transactions are abandoned and
                         #: the host must soft-reset before the next start (``ERROR_PC``: the
                         #: oldest instruction waiting on the bus, docs/architecture.md)


MAGIC = 0x4E505538      # "NPU8"
VERSION = 0x0001_0400   # major 1, minor 4: the bus watchdog and the interrupt enable and
                        # pending registers (minor 3: LOAD_QUANT's float mode; minor 2:
                        # overlapped units, performance counters)


class Reg(enum.IntEnum):
    """Byte offsets of the 32-bit host registers on the AXI4-Lite slave."""
    MAGIC      = 0x00  #: RO  ``MAGIC``
    VERSION    = 0x04  #: RO  ``VERSION`` (major in [31:16], minor in [15:0])
    SHAPE      = 0x08  #: RO  rows R in [15:0], cols C in [31:16]
    SPAD_DEPTH = 0x0C  #: RO  scratchpad rows
    ACC_DEPTH  = 0x10  #: RO  accumulator rows
    BUS_WIDTH  = 0x14  #: RO  AXI4 master data width in bits
    CONTROL    = 0x20  #: WO  bit 0 start, bit 1 soft reset (both self-clearing)
    STATUS     = 0x24  #: RO  bit 0 busy, bit 1 done, bit 2 error, [15:8] error code
    ERROR_PC   = 0x28  #: RO  index of the instruction that failed
    PC         = 0x2C  #: RO  index of the instruction being (or last) executed
    PROG_ADDR  = 0x30  #: RW  DRAM byte address of the program (16-byte aligned)
    PROG_LEN   = 0x34  #: RW  maximum number of instructions in the program
    CYCLES_LO  = 0x38  #: RO  cycles from start to done or error, low word
    CYCLES_HI  = 0x3C  #: RO  the same, high word
    # Performance counters, cleared at start, 32 bits each (they wrap):
    PERF_ARRAY_ROWS   = 0x40  #: RO  activation rows streamed into the array
    PERF_USEFUL_MACS  = 0x44  #: RO  MACs on real operands (rows x k_width x n_width)
    PERF_STALL_FETCH  = 0x48  #: RO  issue cycles waiting for instruction fetch
    PERF_STALL_LOAD   = 0x4C  #: RO  issue cycles waiting for the load unit
    PERF_STALL_STORE  = 0x50  #: RO  issue cycles waiting for the store unit
    PERF_STALL_ARRAY  = 0x54  #: RO  issue cycles waiting for the array (dependency)
    PERF_INSTRUCTIONS = 0x58  #: RO  instructions issued, END included
    PERF_READ_BYTES   = 0x5C  #: RO  bytes read on the AXI4 master (R beats x bus bytes)
    PERF_WRITE_BYTES  = 0x60  #: RO  bytes written on the AXI4 master (W beats x bus bytes)
    # Interrupt and watchdog (0x64 .. 0x6C left for more counters):
    IRQ_ENABLE  = 0x70  #: RW  :class:`Irq` bits that raise ``irq`` (reset: all, ``Irq.ALL``)
    IRQ_PENDING = 0x74  #: W1C :class:`Irq` bits of the ends not yet acknowledged; writing 1
                        #:     clears a bit; a start and a soft reset clear all
    WATCHDOG    = 0x78  #: RW  bus watchdog limit in cycles (reset ``WATCHDOG_RESET``; 0: off)


#: The performance counters by the names the host, the cycle model and the benches report them
#: under (``array_rows``, ``useful_macs``, ...), in register order: ``PERF_ARRAY_ROWS`` is
#: ``array_rows``. Read-only.
PERF_COUNTERS = MappingProxyType({
    reg.name.removeprefix("PERF_").lower(): reg for reg in Reg if reg.name.startswith("PERF_")})


class Status:
    """Bits of the ``STATUS`` register."""
    BUSY = 1 << 0
    DONE = 1 << 1
    ERROR = 1 << 2
    CODE_SHIFT = 8


class Control:
    """Bits of the ``CONTROL`` register."""
    START = 1 << 0
    SOFT_RESET = 1 << 1


class Irq:
    """Bits of ``IRQ_ENABLE`` and ``IRQ_PENDING``: ``irq`` is high while
    ``IRQ_PENDING & IRQ_ENABLE`` is not zero."""
    DONE = 1 << 0    #: a program ended with ``END`` (``STATUS.done``)
    ERROR = 1 << 1   #: a program ended with an error (``STATUS.error``)
    ALL = DONE | ERROR


#: ``Reg.WATCHDOG`` after reset: 2**20 cycles (10.5 ms at 100 MHz) without an answer from the
#: slave ends the run with ``BUS_TIMEOUT``. A healthy DRAM answers within hundreds of cycles,
#: a refresh or a busy interconnect within thousands.
WATCHDOG_RESET = 1 << 20
