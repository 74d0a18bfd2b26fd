"""The SoC's address map and host link, shared by the gateware (:mod:`soc.soc`,
:mod:`soc.ulx3s`) and the host (:mod:`sw.board`).

A leaf module without LiteX, so that the host side can import it cheaply.
"""

__all__ = ["NPU_BASE", "DRAM_BASE", "DRAM_SIZE", "SDRAM_MODULE", "SDRAM_DATA_WIDTH",
           "BAUDRATE"]

#: Byte address of the NPU's registers (:class:`hw.isa.Reg`) on the SoC's bus.
NPU_BASE = 0x8000_0000
#: Byte address of the SDRAM on the SoC's bus and on the NPU's AXI4 master (LiteX's
#: ``main_ram``): the host writes programs and operands there and the NPU reads them there.
DRAM_BASE = 0x4000_0000
#: The ULX3S's SDRAM chip (LiteDRAM's module name) and its data width in bits: 32 MiB.
SDRAM_MODULE = "MT48LC16M16"
SDRAM_DATA_WIDTH = 16
#: Bytes of SDRAM (16 M x 16 bits); :class:`soc.soc.NPUSoC` checks LiteDRAM agrees.
DRAM_SIZE = 32 * 1024 * 1024
#: The host link's baud rate on the ULX3S: its FT231X's highest (3 Mbaud).
BAUDRATE = 3_000_000
