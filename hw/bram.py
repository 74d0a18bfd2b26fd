"""A block RAM with registered reads: one write port and named read ports whose data comes
two cycles after the address, as a block RAM's output register gives it."""

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory, ReadPort, WritePort
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2


__all__ = ["RegisteredMemory", "READ_LATENCY"]


#: Cycles from a read's ``en`` (with its ``addr``) to its ``data``.
READ_LATENCY = 2


class RegisteredMemory(wiring.Component):
    """``depth`` words of ``shape``: one write port and one read port per name in
    ``read_ports``, each read registered twice (address, then data).

    A read with ``en`` high in cycle ``t`` gives row ``addr`` in cycle ``t + 2``; ``data``
    holds until the next read's data arrives. A read of a word written in the same cycle
    is undefined (on a block RAM the two ports collide): callers forward their own writes
    or wait.

    This is the project's own block (no library offers a registered-read memory for
    Amaranth). Every form is the same two registers: anywhere but ECP5 an Amaranth
    :class:`~amaranth.lib.memory.Memory` with a register after its read port.

    ``init``: the words' initial values (for tests; the NPU's memories start at zero).

    Attributes
    ----------
    write : WritePort.Signature
    <name> : ReadPort.Signature
        One per name in ``read_ports``; ``en`` is 1 when left undriven.
    """
    def __init__(self, *, shape, depth, read_ports, init=()):
        self.shape = shape
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
        m = Module()
        m.submodules.memory = memory = Memory(shape=self.shape, depth=self.depth,
                                                   init=self.init)
        wiring.connect(m, wiring.flipped(self.write), memory.write_port())
        for name in self.read_ports:
            port = getattr(self, name)
            raw = memory.read_port(domain="sync")
            m.d.comb += [raw.addr.eq(port.addr), raw.en.eq(port.en)]
            # The output register: loads the row read in the cycle before.
            loaded = Signal(name=f"{name}_loaded")
            m.d.sync += loaded.eq(port.en)
            with m.If(loaded):
                m.d.sync += port.data.eq(raw.data)
        return m
