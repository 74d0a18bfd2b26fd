"""The NPU in a LiteX system on chip: its Verilog as a module of the SoC, its AXI4 master on a
LiteDRAM port, its registers on the SoC's bus, and a UART bridge (UARTBone) for the host.

* :mod:`soc.npu`: the NPU's generated Verilog as a Migen/LiteX module (:class:`NPUCore`).
* :mod:`soc.soc`: the SoC around it (:class:`NPUSoC`), the same for the board and the
  simulation; the address map (:data:`NPU_BASE`, :data:`DRAM_BASE`).
* :mod:`soc.simulation`: the whole SoC under Verilator through LiteX's simulation builder,
  with LiteDRAM's SDRAM model and the UART bridge on a TCP socket.
* :mod:`soc.ulx3s`: the bitstream for the ULX3S (LFE5U-25F/45F/85F) with the PyPI tools.

The host side (the link and the backend that runs compiled programs) is :mod:`sw.board`.
"""
