"""A block RAM with registered reads: one write port and named read ports whose data comes
two cycles after the address, as a block RAM's output register gives it."""

from amaranth.hdl import Cat, ClockSignal, Const, Instance, Module, Mux, Shape, Signal, Value
from amaranth.lib import wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2


__all__ = ["RegisteredMemory", "READ_LATENCY", "ECP5_ASPECTS", "ecp5_aspect", "dp16kd",
           "pdpw16kd", "bank_select"]


#: Cycles from a read's ``en`` (with its ``addr``) to its ``data``.
READ_LATENCY = 2

#: The shapes of one ECP5 block RAM (16K bits, 18K with the ninth bit of each byte), as
#: ``(data width, address bits)``: 512x36 (a PDPW16KD), then the DP16KD's 1Kx18 to 16Kx1.
ECP5_ASPECTS = ((36, 9), (18, 10), (9, 11), (4, 12), (2, 13), (1, 14))


def _ceil_div(numerator, denominator):
    return -(-numerator // denominator)


def ecp5_aspect(width, depth):
    """The ``(block width, address bits)`` of :data:`ECP5_ASPECTS` that holds ``depth``
    words of ``width`` bits in the fewest blocks; among those, in the fewest banks (blocks
    one after the other in depth), then the narrowest."""
    def cost(aspect):
        block_width, address_bits = aspect
        banks = _ceil_div(depth, 1 << address_bits)
        return _ceil_div(width, block_width) * banks, banks, block_width
    return min(ECP5_ASPECTS, key=cost)


def _pins(name, value, count):
    """``{name0: value[0], ...}`` for ``count`` input pins, zero past the end of ``value``."""
    value = Value.cast(value)
    return {f"i_{name}{bit}": value[bit] if bit < len(value) else Const(0)
            for bit in range(count)}


def dp16kd(m, name, *, width, write_addr, write_data, write_en, read_addr, read_en,
           output_en):
    """A DP16KD block RAM ``width`` bits wide (1, 2, 4, 9 or 18), the submodule ``name`` of
    ``m``, on the ``sync`` clock: port A writes ``write_data`` at ``write_addr`` when
    ``write_en``; port B reads ``read_addr`` into its address stage when ``read_en`` and
    loads its output register (``REGMODE_B = "OUTREG"``) when ``output_en``. Returns the
    output register's value.

    Write mode NORMAL: a read of the word written in the same cycle is undefined. The
    resets are tied off: the output register holds its word through a reset."""
    address_shift = {1: 0, 2: 1, 4: 2, 9: 3, 18: 4}[width]
    # The word address sits above the bits a wide word leaves free; x18 takes its two
    # byte enables (AD0, AD1) from those.
    byte_enables = Const(0b11 if width == 18 else 0, address_shift)
    read_data = Signal(width, name=f"{name}_data")
    m.submodules[name] = Instance(
        "DP16KD",
        p_DATA_WIDTH_A=width, p_DATA_WIDTH_B=width,
        p_REGMODE_A="NOREG", p_REGMODE_B="OUTREG",
        p_WRITEMODE_A="NORMAL", p_WRITEMODE_B="NORMAL",
        p_CSDECODE_A="0b000", p_CSDECODE_B="0b000",
        p_RESETMODE="SYNC", p_GSR="DISABLED",
        i_CLKA=ClockSignal("sync"), i_CEA=write_en, i_WEA=write_en, i_OCEA=Const(0),
        i_RSTA=Const(0),
        i_CLKB=ClockSignal("sync"), i_CEB=read_en, i_WEB=Const(0), i_OCEB=output_en,
        i_RSTB=Const(0),
        **_pins("ADA", Cat(byte_enables, write_addr), 14),
        **_pins("ADB", Cat(Const(0, address_shift), read_addr), 14),
        **_pins("CSA", Const(0, 3), 3), **_pins("CSB", Const(0, 3), 3),
        **_pins("DIA", write_data, 18), **_pins("DIB", Const(0, 18), 18),
        **{f"o_DOB{bit}": read_data[bit] for bit in range(width)},
    )
    return read_data


def pdpw16kd(m, name, *, width, write_addr, write_data, write_en, read_addr, read_en,
             output_en):
    """The same as :func:`dp16kd` for ``width`` 36 (512 words), on a PDPW16KD: the
    block's pseudo-dual-port form (write port W, read port R, byte enables BE). nextpnr
    turns it into a DP16KD bel itself; that leaves to nextpnr which DP16KD pins carry which
    half of the 36-bit word, where Yosys' own 36-bit DP16KD map and nextpnr's PDPW16KD
    conversion disagree about the read data's halves."""
    assert width == 36
    read_data = Signal(36, name=f"{name}_data")
    m.submodules[name] = Instance(
        "PDPW16KD",
        p_DATA_WIDTH_W=36, p_DATA_WIDTH_R=36, p_REGMODE="OUTREG",
        p_CSDECODE_W="0b000", p_CSDECODE_R="0b000",
        p_RESETMODE="SYNC", p_GSR="DISABLED",
        i_CLKW=ClockSignal("sync"), i_CEW=write_en,
        i_CLKR=ClockSignal("sync"), i_CER=read_en, i_OCER=output_en, i_RST=Const(0),
        **_pins("BE", Const(0b1111, 4), 4),
        **_pins("ADW", write_addr, 9),
        # The read address pins count bits: a 36-bit word (32 data bits) is ADR13 to ADR5.
        **_pins("ADR", Cat(Const(0, 5), read_addr), 14),
        **_pins("CSW", Const(0, 3), 3), **_pins("CSR", Const(0, 3), 3),
        **_pins("DI", write_data, 36),
        **{f"o_DO{bit}": read_data[bit] for bit in range(36)},
    )
    return read_data


def bank_select(m, name, *, bank, read_en, output_en):
    """The bank a read port's ``data`` comes from: ``bank`` (the read address's high bits)
    registered with the address stage (``read_en``), then again with the output registers
    (``output_en``), so that the bank multiplexer follows the block RAMs' output
    registers. Not reset, like the output registers themselves."""
    address_stage = Signal.like(bank, name=f"{name}_read_bank", reset_less=True)
    output_stage = Signal.like(bank, name=f"{name}_data_bank", reset_less=True)
    # Multiplexers, not m.If: Icarus runs an `always @*` only once an input changes, so a
    # register with neither reset nor a change before the first edge would load X.
    m.d.sync += [address_stage.eq(Mux(read_en, bank, address_stage)),
                 output_stage.eq(Mux(output_en, address_stage, output_stage))]
    return output_stage


class RegisteredMemory(wiring.Component):
    """``depth`` words of ``shape``: one write port and one read port per name in
    ``read_ports``, each read registered twice (address, then data).

    A read with ``en`` high in cycle ``t`` gives row ``addr`` in cycle ``t + 2``; ``data``
    holds until the next read's data arrives, and through a reset (the output register of
    a block RAM is not reset). A read of a word written in the same cycle is undefined (on
    a block RAM the two ports collide): callers forward their own writes or wait, or ask
    for ``transparent`` reads, which give the word written (the memory compares the
    addresses into a register beside the address stage, and a 2:1 multiplexer after the
    output register picks the written word).

    This is the project's own block (no library offers a registered-read memory for
    Amaranth). Every form is the same two registers:

    * On ECP5 (``platform.family == "ecp5"``), each read port has its own copy of the
      memory on hand-instantiated block RAMs with their output register on
      (:func:`dp16kd`, :func:`pdpw16kd`): Yosys never uses that register when it maps a
      memory, and a block RAM without it takes 5.6 ns from clock to data. The shape of the
      blocks comes from :func:`ecp5_aspect`; blocks side by side cover the width, banks of
      them the depth, with the bank multiplexer after the output registers
      (:func:`bank_select`). Every copy takes every write. ``tb/models/`` has simulation
      models of the two primitives.
    * Anywhere else, an Amaranth :class:`~amaranth.lib.memory.Memory` with a register after
      each of its read ports.

    Parameters
    ----------
    shape, depth : the words' shape and their number.
    read_ports : names of the read ports.
    init : the words' initial values, for tests; only the plain form takes values other
        than zero (the NPU's memories start at zero, and so do the block RAMs here).
    transparent : a read of the word written in the same cycle gives the word written.

    Attributes
    ----------
    write : WritePort.Signature
    <name> : ReadPort.Signature
        One per name in ``read_ports``; ``en`` is 1 when left undriven.
    """
    def __init__(self, *, shape, depth, read_ports, init=(), transparent=False):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive integer, not {depth!r}")
        self.shape = shape
        self.transparent = bool(transparent)
        self.depth = depth
        self.init = tuple(init)
        self.read_ports = tuple(read_ports)
        ports = dict(addr_width=ceil_log2(depth), shape=shape)
        members = {"write": Out(WritePort.Signature(**ports))}
        for name in self.read_ports:
            if name == "write" or name in members:
                raise ValueError(f"read port name {name!r} is taken")
            members[name] = Out(ReadPort.Signature(**ports))
        super().__init__(members)

    def elaborate(self, platform):
        ecp5 = getattr(platform, "family", None) == "ecp5"
        if ecp5 and any(self.init):
            raise ValueError("init must be all zero on ECP5 (its block RAMs start at zero "
                             f"here), not {self.init!r}")
        m = Module()
        if ecp5:
            self._elaborate_ecp5(m)
            return m
        self._elaborate_plain(m)
        return m

    def _elaborate_plain(self, m):
        m.submodules.array = memory = Memory(shape=self.shape, depth=self.depth,
                                              init=self.init)
        wiring.connect(m, wiring.flipped(self.write), memory.write_port())
        for name in self.read_ports:
            port = getattr(self, name)
            raw = memory.read_port(domain="sync")
            m.d.comb += [raw.addr.eq(port.addr), raw.en.eq(port.en)]
            # The output register: loads the row read in the cycle before. Not reset, like
            # a block RAM's; a multiplexer for Icarus' sake (see bank_select).
            loaded = Signal(name=f"{name}_loaded")
            data = Signal.like(Value.cast(port.data), name=f"{name}_data", reset_less=True)
            m.d.sync += [loaded.eq(port.en), data.eq(Mux(loaded, raw.data, data))]
            m.d.comb += Value.cast(port.data).eq(self._forward(m, name, port, loaded, data))

    def _elaborate_ecp5(self, m):
        width = Shape.cast(self.shape).width
        block_width, address_bits = ecp5_aspect(width, self.depth)
        block = pdpw16kd if block_width == 36 else dp16kd
        columns = _ceil_div(width, block_width)
        banks = _ceil_div(self.depth, 1 << address_bits)
        write_data = Value.cast(self.write.data)
        # The banks are the address's high bits: one bank has none.
        write_bank = self.write.addr[address_bits:]
        for name in self.read_ports:
            port = getattr(self, name)
            loaded = Signal(name=f"{name}_loaded")
            m.d.sync += loaded.eq(port.en)
            bank_data = []
            for bank in range(banks):
                write_en = self.write.en & (write_bank == bank) if banks > 1 else self.write.en
                words = [block(m, f"{name}_bank{bank}_column{column}",
                               width=block_width,
                               write_addr=self.write.addr[:address_bits],
                               write_data=write_data[column * block_width:
                                                     (column + 1) * block_width],
                               write_en=write_en,
                               read_addr=port.addr[:address_bits], read_en=port.en,
                               output_en=loaded)
                         for column in range(columns)]
                bank_data.append(Cat(*words)[:width])
            data = bank_data[0]
            if banks > 1:
                selected = bank_select(m, name, bank=port.addr[address_bits:],
                                       read_en=port.en, output_en=loaded)
                for bank in range(1, banks):
                    data = Mux(selected == bank, bank_data[bank], data)
            m.d.comb += Value.cast(port.data).eq(self._forward(m, name, port, loaded, data))

    def _forward(self, m, name, port, loaded, data):
        """``data`` (the output register's word), or with ``transparent`` the word written
        in the cycle of the read when the addresses were equal: the comparison and the
        word pass two registers loaded as the address stage and the output register are,
        and hold through a reset as the output register does."""
        if not self.transparent:
            return data
        stages = []
        for stage, enable in (("read", port.en), ("data", loaded)):
            hit = Signal(name=f"{name}_{stage}_hit", reset_less=True)
            word = Signal.like(data, name=f"{name}_{stage}_written", reset_less=True)
            if not stages:
                new_hit = self.write.en & (self.write.addr == port.addr)
                new_word = self.write.data
            else:
                new_hit, new_word = stages[-1]
            m.d.sync += [hit.eq(Mux(enable, new_hit, hit)), word.eq(Mux(enable, new_word, word))]
            stages.append((hit, word))
        hit, word = stages[-1]
        return Mux(hit, word, data)
