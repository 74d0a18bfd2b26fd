"""The instruction encoding: ``sw.codec`` must agree bit for bit with ``hw.isa``."""

import random

import pytest

from hw import isa
from hw.isa import Opcode, QuantMode
from sw import codec
from sw.errors import NPUTypeError, NPUValueError


#: The fields of each opcode, as the ISA documents them (a change here is an ISA change).
EXPECTED_FIELDS = {
    Opcode.END:       [],
    Opcode.LOAD_SPAD: ["local_addr", "rows", "row_bytes", "dram_addr", "dram_stride"],
    Opcode.LOAD_ACC:  ["local_addr", "rows", "row_bytes", "dram_addr", "dram_stride"],
    Opcode.PRELOAD:   ["spad_addr"],
    Opcode.MATMUL:    ["spad_addr", "acc_addr", "rows", "accumulate", "k_width", "n_width"],
    Opcode.STORE:     ["acc_addr", "rows", "row_bytes", "dram_addr", "dram_stride"],
    Opcode.LOAD_QUANT: ["dram_addr", "dram_stride", "row_bytes", "zero_point", "mode",
                        "act_min", "act_max"],
    Opcode.STORE_Q:   ["acc_addr", "rows", "row_bytes", "dram_addr", "dram_stride"],
}
EXPECTED_WIDTHS = {"local_addr": 16, "rows": 16, "row_bytes": 16, "dram_addr": 32,
                   "dram_stride": 32, "spad_addr": 16, "acc_addr": 16, "accumulate": 1,
                   "k_width": 9, "n_width": 9,
                   "zero_point": 15, "mode": 1, "act_min": 8, "act_max": 8}
#: The two's complement fields; every other field is unsigned.
SIGNED_FIELDS = {"zero_point", "act_min", "act_max"}


def random_fields(opcode, rng):
    return {spec.name: rng.randint(spec.minimum, spec.maximum) for spec in codec.FIELDS[opcode]}


def test_instruction_size():
    assert isa.INSTR_BITS == 128
    assert isa.INSTR_BYTES == 16


@pytest.mark.parametrize("opcode", list(Opcode), ids=lambda opcode: opcode.name)
def test_fields_match_isa(opcode):
    assert [spec.name for spec in codec.FIELDS[opcode]] == EXPECTED_FIELDS[opcode]
    for spec in codec.FIELDS[opcode]:
        assert spec.width == EXPECTED_WIDTHS[spec.name]
        assert spec.signed == (spec.name in SIGNED_FIELDS)
        if spec.signed:
            assert (spec.minimum, spec.maximum) == (-(1 << (spec.width - 1)),
                                                    (1 << (spec.width - 1)) - 1)
        else:
            assert (spec.minimum, spec.maximum) == (0, spec.mask)


@pytest.mark.parametrize("opcode", list(Opcode), ids=lambda opcode: opcode.name)
def test_round_trip_against_hw_isa(opcode):
    seed = 1000 + opcode.value
    print(f"seed {seed}")
    rng = random.Random(seed)
    for _ in range(50):
        fields = random_fields(opcode, rng)
        word = codec.encode(opcode, **fields)
        assert word == isa.encode(opcode, **fields)
        assert codec.decode(word) == (opcode, fields)
        assert isa.decode(word) == (opcode, fields)


@pytest.mark.parametrize("opcode", list(Opcode), ids=lambda opcode: opcode.name)
def test_field_extremes(opcode):
    specs = codec.FIELDS[opcode]
    for value_of in (lambda spec: 0, lambda spec: spec.minimum, lambda spec: spec.maximum,
                     lambda spec: -1 if spec.signed else 1):
        fields = {spec.name: value_of(spec) for spec in specs}
        word = codec.encode(opcode, **fields)
        assert word == isa.encode(opcode, **fields)
        assert codec.decode(word) == (opcode, fields)
        assert isa.decode(word) == (opcode, fields)
    # Each field alone with all its bits set (-1 when signed) sets exactly its own bits.
    for spec in specs:
        fields = {other.name: 0 for other in specs}
        fields[spec.name] = -1 if spec.signed else spec.mask
        word = codec.encode(opcode, **fields)
        assert word == opcode.value | (spec.mask << spec.offset)
        assert codec.decode(word) == (opcode, fields)


@pytest.mark.parametrize("mode", list(QuantMode))
def test_signed_fields_two_complement(mode):
    fields = dict(dram_addr=0x1000, dram_stride=64, row_bytes=32, zero_point=-128,
                  mode=mode, act_min=-128, act_max=-1)
    word = codec.encode(Opcode.LOAD_QUANT, **fields)
    assert word == isa.encode(Opcode.LOAD_QUANT, **fields)
    specs = {spec.name: spec for spec in codec.FIELDS[Opcode.LOAD_QUANT]}
    # The zero point's 15 bits end below the mode bit: a negative one does not set it.
    for name, raw in (("zero_point", 0x7F80), ("mode", mode.value), ("act_min", 0x80),
                      ("act_max", 0xFF)):
        spec = specs[name]
        assert (word >> spec.offset) & spec.mask == raw
    assert codec.decode(word) == (Opcode.LOAD_QUANT, fields)


def test_fields_do_not_overlap():
    for opcode, specs in codec.FIELDS.items():
        used = 0xFFFF  # opcode and reserved bytes
        for spec in specs:
            bits = spec.mask << spec.offset
            assert used & bits == 0, (opcode, spec)
            used |= bits
        assert used < 1 << isa.INSTR_BITS


@pytest.mark.parametrize("opcode", [op for op in Opcode if codec.FIELDS[op]],
                         ids=lambda opcode: opcode.name)
def test_field_limits_rejected(opcode):
    for spec in codec.FIELDS[opcode]:
        fields = {other.name: 0 for other in codec.FIELDS[opcode]}
        for bad in (spec.maximum + 1, spec.minimum - 1):
            fields[spec.name] = bad
            with pytest.raises(NPUValueError, match=spec.name):
                codec.encode(opcode, **fields)
        fields[spec.name] = 1.5
        with pytest.raises(NPUTypeError, match=spec.name):
            codec.encode(opcode, **fields)


def test_missing_and_unknown_fields_rejected():
    with pytest.raises(NPUValueError, match="missing.*rows"):
        codec.encode(Opcode.MATMUL, spad_addr=0, acc_addr=0, accumulate=0)
    with pytest.raises(NPUValueError, match="unknown.*bogus"):
        codec.encode(Opcode.PRELOAD, spad_addr=0, bogus=1)
    with pytest.raises(NPUValueError, match="END takes"):
        codec.encode(Opcode.END, rows=1)


def test_illegal_opcodes():
    with pytest.raises(NPUValueError, match="opcode"):
        codec.encode(0x7F)
    legal = {opcode.value for opcode in Opcode}
    for value in range(256):
        word = value | (0xABCD << 16)
        if value in legal:
            assert codec.decode(word)[0] is Opcode(value)
        else:
            assert codec.decode(word) == (None, {})
            assert isa.decode(word) == (None, {})
    # Zeroed memory must not decode as an instruction.
    assert codec.decode(0) == (None, {})


def test_reserved_byte_is_ignored_by_decode():
    word = codec.encode(Opcode.PRELOAD, spad_addr=7)
    assert codec.decode(word | (0x5A << 8)) == (Opcode.PRELOAD, {"spad_addr": 7})


def test_word_range_checked():
    with pytest.raises(NPUValueError):
        codec.decode(1 << 128)
    with pytest.raises(NPUValueError):
        codec.decode(-1)


def test_pack_and_unpack():
    words = [codec.encode(Opcode.PRELOAD, spad_addr=3), codec.encode(Opcode.END)]
    image = codec.pack_words(words)
    assert len(image) == 32
    assert image[0] == Opcode.PRELOAD.value and image[2] == 3 and image[16] == Opcode.END.value
    assert codec.unpack_words(image) == words
    with pytest.raises(NPUValueError, match="multiple of 16"):
        codec.unpack_words(image[:-1])


def test_perf_counters():
    """The counter names are the JSON keys of ``npu gemm`` and the bench: renaming one is an
    interface change. They come in register order and cannot be changed at run time."""
    assert list(isa.PERF_COUNTERS.items()) == [
        ("array_rows", isa.Reg.PERF_ARRAY_ROWS), ("useful_macs", isa.Reg.PERF_USEFUL_MACS),
        ("stall_fetch", isa.Reg.PERF_STALL_FETCH), ("stall_load", isa.Reg.PERF_STALL_LOAD),
        ("stall_store", isa.Reg.PERF_STALL_STORE), ("stall_array", isa.Reg.PERF_STALL_ARRAY),
        ("instructions", isa.Reg.PERF_INSTRUCTIONS), ("read_bytes", isa.Reg.PERF_READ_BYTES),
        ("write_bytes", isa.Reg.PERF_WRITE_BYTES)]
    with pytest.raises(TypeError):
        isa.PERF_COUNTERS["cycles"] = isa.Reg.CYCLES_LO


def test_watchdog_and_interrupt_registers():
    """Version 1.4's registers: their offsets, bits and reset values are the interface."""
    assert isa.VERSION == 0x0001_0400
    assert isa.ErrorCode.BUS_TIMEOUT.value == 11
    assert (isa.Reg.IRQ_ENABLE, isa.Reg.IRQ_PENDING, isa.Reg.WATCHDOG) == (0x70, 0x74, 0x78)
    assert (isa.Irq.DONE, isa.Irq.ERROR, isa.Irq.ALL) == (1, 2, 3)
    assert isa.WATCHDOG_RESET == 1 << 20
    # Offsets are distinct and word-aligned within the host's 8-bit address space.
    offsets = [reg.value for reg in isa.Reg]
    assert len(set(offsets)) == len(offsets) and all(o % 4 == 0 and o < 256 for o in offsets)


def test_every_error_code_has_a_text():
    from sw.errors import ERROR_TEXT, NPURunError

    assert set(ERROR_TEXT) == set(isa.ErrorCode)
    error = NPURunError(isa.ErrorCode.BUS_TIMEOUT, 3)
    assert str(error) == ("the NPU program stopped with error BUS_TIMEOUT at instruction 3: "
                          "the bus did not answer within the watchdog's limit; soft-reset the "
                          "NPU (CONTROL bit 1) before the next start")
