"""The scratchpad: software-managed SRAM of INT8 rows."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out


__all__ = ["Scratchpad", "ScratchpadSignature"]


def ScratchpadSignature(depth, row_bytes):
    """Ports of a :class:`Scratchpad`, as the memory sees them."""
    return wiring.Signature({
        "read_addr":  In(range(depth)),
        "read_en":    In(1),
        "read_data":  Out(8 * row_bytes),
        "write_addr": In(range(depth)),
        "write_en":   In(1),
        "write_data": In(8 * row_bytes),
        "weight_addr": In(range(depth)),
        "weight_en":   In(1),
        "weight_data": Out(8 * row_bytes),
    })


class Scratchpad(wiring.Component):
    """Explicitly addressed SRAM of ``depth`` rows of ``row_bytes`` INT8 values.

    There are no tags and no replacement policy (seeds section 2): instructions name rows.
    Two synchronous read ports (data in the cycle after ``read_en``) and one write port:
    activations stream out of the first while the next weight tile leaves through the second.

    Attributes
    ----------
    read_addr : In(range(depth))
    read_en : In(1)
    read_data : Out(8 * row_bytes)
        Row ``read_addr`` from the cycle before; holds while ``read_en`` is low.
    write_addr : In(range(depth))
    write_en : In(1)
    write_data : In(8 * row_bytes)
    weight_addr, weight_en : In
    weight_data : Out(8 * row_bytes)
        The second read port, as ``read_*``.
    """
    def __init__(self, *, depth, row_bytes):
        self.depth = depth
        self.row_bytes = row_bytes
        super().__init__(ScratchpadSignature(depth, row_bytes))

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = memory = Memory(shape=8 * self.row_bytes, depth=self.depth, init=[])
        write = memory.write_port()
        read = memory.read_port(domain="sync")
        weight = memory.read_port(domain="sync")
        m.d.comb += [
            weight.addr.eq(self.weight_addr),
            weight.en.eq(self.weight_en),
            self.weight_data.eq(weight.data),
            write.addr.eq(self.write_addr),
            write.en.eq(self.write_en),
            write.data.eq(self.write_data),
            read.addr.eq(self.read_addr),
            read.en.eq(self.read_en),
            self.read_data.eq(read.data),
        ]
        return m
