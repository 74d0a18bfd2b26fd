"""AXI4 and AXI4-Lite bus signatures (AMBA AXI and ACE Protocol Specification, issue H).

Member names are the lower-case AXI signal names, so that the top level can expose them as
``m_axi_awaddr``, ``s_axil_rdata`` and so on: the names cocotbext-axi attaches to by prefix and
FPGA tools recognise. Signatures are written from the manager's (master's) point of view.
"""

from amaranth.hdl import unsigned
from amaranth.lib import wiring, enum
from amaranth.lib.wiring import In, Out

from .config import BUS_WIDTHS


__all__ = ["Burst", "Resp", "AXI4Signature", "AXI4ReadSignature", "AXI4WriteSignature",
           "AXI4LiteSignature"]


class Burst(enum.Enum, shape=2):
    FIXED = 0
    INCR  = 1
    WRAP  = 2


class Resp(enum.Enum, shape=2):
    OKAY   = 0
    EXOKAY = 1
    SLVERR = 2
    DECERR = 3


def _write_members(addr_width, data_width, id_width):
    return {
        # Write address channel
        "awid":    Out(id_width),
        "awaddr":  Out(addr_width),
        "awlen":   Out(8),
        "awsize":  Out(3),
        "awburst": Out(2),
        "awlock":  Out(1),
        "awcache": Out(4),
        "awprot":  Out(3),
        "awvalid": Out(1),
        "awready": In(1),
        # Write data channel
        "wdata":   Out(data_width),
        "wstrb":   Out(data_width // 8),
        "wlast":   Out(1),
        "wvalid":  Out(1),
        "wready":  In(1),
        # Write response channel
        "bid":     In(id_width),
        "bresp":   In(2),
        "bvalid":  In(1),
        "bready":  Out(1),
    }


def _read_members(addr_width, data_width, id_width):
    return {
        # Read address channel
        "arid":    Out(id_width),
        "araddr":  Out(addr_width),
        "arlen":   Out(8),
        "arsize":  Out(3),
        "arburst": Out(2),
        "arlock":  Out(1),
        "arcache": Out(4),
        "arprot":  Out(3),
        "arvalid": Out(1),
        "arready": In(1),
        # Read data channel
        "rid":     In(id_width),
        "rdata":   In(data_width),
        "rresp":   In(2),
        "rlast":   In(1),
        "rvalid":  In(1),
        "rready":  Out(1),
    }


class _AXI4Channels(wiring.Signature):
    """An AXI4 manager interface made of the channels in ``_channels``."""
    _channels = ()

    def __init__(self, *, addr_width, data_width, id_width=1):
        if data_width not in BUS_WIDTHS:
            raise ValueError(f"data_width must be one of {', '.join(map(str, BUS_WIDTHS))}, "
                             f"not {data_width!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        self.id_width = id_width
        members = {}
        for channels in self._channels:
            members.update(channels(addr_width, data_width, id_width))
        super().__init__(members)


class AXI4Signature(_AXI4Channels):
    """AXI4 manager interface (INCR bursts, one ID): the write channels, then the read ones.

    Parameters
    ----------
    addr_width : int
        Width of ``awaddr`` / ``araddr``.
    data_width : int
        Width of ``wdata`` / ``rdata``, one of :data:`hw.config.BUS_WIDTHS` (32 to 512).
    id_width : int
        Width of the ID signals.
    """
    _channels = (_write_members, _read_members)


class AXI4ReadSignature(_AXI4Channels):
    """The read channels (``ar*``, ``r*``) of :class:`AXI4Signature`, for a read-only
    manager; the parameters are the same."""
    _channels = (_read_members,)


class AXI4WriteSignature(_AXI4Channels):
    """The write channels (``aw*``, ``w*``, ``b*``) of :class:`AXI4Signature`, for a
    write-only manager; the parameters are the same."""
    _channels = (_write_members,)


class AXI4LiteSignature(wiring.Signature):
    """AXI4-Lite manager interface. A register file takes the ``.flip()`` of it."""
    def __init__(self, *, addr_width, data_width=32):
        if data_width not in (32, 64):
            raise ValueError(f"data_width must be 32 or 64, not {data_width!r}")
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "awaddr":  Out(addr_width),
            "awprot":  Out(3),
            "awvalid": Out(1),
            "awready": In(1),
            "wdata":   Out(data_width),
            "wstrb":   Out(data_width // 8),
            "wvalid":  Out(1),
            "wready":  In(1),
            "bresp":   In(2),
            "bvalid":  In(1),
            "bready":  Out(1),
            "araddr":  Out(addr_width),
            "arprot":  Out(3),
            "arvalid": Out(1),
            "arready": In(1),
            "rdata":   In(data_width),
            "rresp":   In(2),
            "rvalid":  In(1),
            "rready":  Out(1),
        })
