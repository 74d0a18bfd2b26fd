"""The scratchpad: software-managed SRAM of INT8 rows."""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.memory import ReadPort, WritePort
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

from .bram import RegisteredMemory


__all__ = ["Scratchpad", "ScratchpadSignature"]


def ScratchpadSignature(depth, row_bytes):
    """Ports of a :class:`Scratchpad`, as the memory sees them: Amaranth's own memory port
    signatures (a read port's ``en`` is 1 when left undriven; the controller drives it)."""
    ports = dict(addr_width=ceil_log2(depth), shape=8 * row_bytes)
    return wiring.Signature({
        "act":    Out(ReadPort.Signature(**ports)),
        "weight": Out(ReadPort.Signature(**ports)),
        "write":  Out(WritePort.Signature(**ports)),
    })


class Scratchpad(wiring.Component):
    """Explicitly addressed SRAM of ``depth`` rows of ``row_bytes`` INT8 values.

    There are no tags and no replacement policy (seeds section 2): instructions name rows.
    Two registered read ports (:class:`~hw.bram.RegisteredMemory`: data two cycles after
    ``en``) and one write port: activations stream out of the first while the next weight
    tile leaves through the second.

    Attributes
    ----------
    act : ReadPort.Signature
        The activation read port: ``data`` is row ``addr`` from two cycles before; it holds
        while ``en`` is low.
    weight : ReadPort.Signature
        The weight read port, as ``act``.
    write : WritePort.Signature
    """
    def __init__(self, *, depth, row_bytes):
        self.depth = depth
        self.row_bytes = row_bytes
        super().__init__(ScratchpadSignature(depth, row_bytes))

    def elaborate(self, platform):
        m = Module()
        m.submodules.memory = memory = RegisteredMemory(
            shape=8 * self.row_bytes, depth=self.depth, read_ports=("act", "weight"),
            # The load unit writes a row from its registers a cycle after the DMA delivered
            # it: a MATMUL or PRELOAD issued as the load ends reads its last row in the
            # cycle of that write.
            transparent=True)
        for name in ("write", "act", "weight"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(memory, name))
        return m
