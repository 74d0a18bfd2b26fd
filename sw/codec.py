"""Fast instruction encoding and decoding for the compiler and the model.

:func:`hw.isa.encode` and :func:`hw.isa.decode` go through Amaranth constants and take about
100 us per instruction: too slow for the half-million instructions of a ``K = MAX_K`` program
on a 1x1 array. This module reads the offset and width of every field out of the very same
:class:`hw.isa.Instruction` layout once, at import, and then packs and unpacks words with shifts
and masks. No bit position is written down here, so the two cannot drift apart;
``tb/test_isa.py`` checks that both agree bit for bit.

Unlike :func:`hw.isa.encode`, :func:`encode` requires every field of the opcode and rejects a
value that does not fit its field, instead of truncating it.

Signed fields (``LOAD_QUANT``'s ``zero_point``, ``act_min`` and ``act_max``) take values in
``-2**(width-1) .. 2**(width-1)-1``, are stored in two's complement and decode sign-extended,
exactly as the Amaranth layout (``signed(width)``) does.
"""

import operator
from dataclasses import dataclass

from amaranth.hdl import Shape
from amaranth.lib import data

from hw import isa
from .errors import NPUTypeError, NPUValueError


__all__ = ["FieldSpec", "FIELDS", "encode", "decode", "pack_words", "unpack_words"]


@dataclass(frozen=True)
class FieldSpec:
    """Where one instruction field sits in the 128-bit word.

    Attributes
    ----------
    name : str
    offset : int
        Bit offset of the least significant bit in the instruction word.
    width : int
        Width in bits.
    signed : bool
        Whether the field holds a two's complement signed value.
    """
    name: str
    offset: int
    width: int
    signed: bool = False

    @property
    def mask(self):
        return (1 << self.width) - 1

    @property
    def minimum(self):
        """Smallest value the field takes."""
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def maximum(self):
        """Largest value the field takes."""
        return (1 << (self.width - 1)) - 1 if self.signed else self.mask


_INSTRUCTION = data.Layout.cast(isa.Instruction)
_OPCODE = FieldSpec("opcode", _INSTRUCTION["opcode"].offset, _INSTRUCTION["opcode"].width)
_ARGS_OFFSET = _INSTRUCTION["args"].offset
_WORD_MASK = (1 << isa.INSTR_BITS) - 1


def _fields_of(opcode):
    layout = isa.argument_layout(opcode)
    if layout is None:
        return ()
    return tuple(FieldSpec(name, _ARGS_OFFSET + field.offset, field.width,
                           Shape.cast(field.shape).signed)
                 for name, field in layout)


#: The fields of each opcode, in layout order, with absolute bit offsets.
FIELDS = {opcode: _fields_of(opcode) for opcode in isa.Opcode}
_OPCODE_BY_VALUE = {opcode.value: opcode for opcode in isa.Opcode}
# Plain tuples for the hot loops: attribute and property lookups dominate otherwise.
_PACKING = {opcode: tuple((spec.name, spec.offset, spec.mask, spec.width, spec.minimum,
                            spec.maximum, spec.signed) for spec in specs)
            for opcode, specs in FIELDS.items()}
_NAMES = {opcode: frozenset(spec.name for spec in specs) for opcode, specs in FIELDS.items()}


def encode(opcode, **fields):
    """Encode one instruction into its 128-bit integer.

    Parameters
    ----------
    opcode : hw.isa.Opcode or int
    **fields : int
        Every field of that opcode (see :data:`FIELDS`; those in
        :data:`hw.isa.OPTIONAL_FIELDS` default to 0), each within its field's range
        (``FieldSpec.minimum .. FieldSpec.maximum``; signed fields take negative values).

    Returns
    -------
    int

    Raises
    ------
    NPUValueError
        On an unknown opcode, a missing or unknown field, or a value that does not fit.
    NPUTypeError
        On a field value that is not an integer.
    """
    if type(opcode) is not isa.Opcode:
        try:
            opcode = isa.Opcode(opcode)
        except ValueError:
            raise NPUValueError(f"opcode must be one of {[op.name for op in isa.Opcode]}, "
                                f"not {opcode!r}") from None
    expected = _NAMES[opcode]
    if fields.keys() != expected:
        fields = {**{name: 0 for name in expected & isa.OPTIONAL_FIELDS}, **fields}
    if fields.keys() != expected:
        missing = sorted(expected - set(fields))
        unknown = sorted(set(fields) - expected)
        raise NPUValueError(f"{opcode.name} takes the fields {sorted(expected)}; "
                            f"missing {missing}, unknown {unknown}")
    word = opcode.value << _OPCODE.offset
    for name, offset, mask, width, minimum, maximum, signed in _PACKING[opcode]:
        try:
            value = operator.index(fields[name])
        except TypeError:
            raise NPUTypeError(f"{opcode.name} field {name} must be an integer, "
                               f"not {fields[name]!r}") from None
        if not minimum <= value <= maximum:
            kind = "signed, " if signed else ""
            raise NPUValueError(f"{opcode.name} field {name} must be in {minimum}..{maximum} "
                                f"({kind}{width} bits), not {value}")
        word |= (value & mask) << offset
    return word


def decode(word):
    """Decode a 128-bit instruction word into ``(opcode, fields)``.

    Returns the same as :func:`hw.isa.decode`: ``opcode`` is ``None`` for an illegal opcode,
    and ``fields`` is then empty. The reserved byte is ignored, as the controller ignores it.
    """
    if not 0 <= word <= _WORD_MASK:
        raise NPUValueError(f"an instruction word must be in 0..2**{isa.INSTR_BITS}-1, "
                            f"not {word}")
    opcode = _OPCODE_BY_VALUE.get((word >> _OPCODE.offset) & _OPCODE.mask)
    if opcode is None:
        return None, {}
    fields = {}
    for name, offset, mask, width, _, _, signed in _PACKING[opcode]:
        value = (word >> offset) & mask
        if signed and value >> (width - 1):
            value -= 1 << width
        fields[name] = value
    return opcode, fields


def pack_words(words):
    """The bytes of a program as it sits in DRAM: each word little-endian in 16 bytes."""
    return b"".join(word.to_bytes(isa.INSTR_BYTES, "little") for word in words)


def unpack_words(image):
    """The inverse of :func:`pack_words`."""
    image = bytes(image)
    if len(image) % isa.INSTR_BYTES:
        raise NPUValueError(f"a program image must be a multiple of {isa.INSTR_BYTES} bytes, "
                            f"not {len(image)}")
    return [int.from_bytes(image[offset:offset + isa.INSTR_BYTES], "little")
            for offset in range(0, len(image), isa.INSTR_BYTES)]
