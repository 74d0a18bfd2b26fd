"""The NPU on Lattice ECP5 with the open flow (Yosys, nextpnr): out-of-context synthesis,
place and route and a JSON report (:mod:`fpga.flow`), the scan harness that keeps the AXI
ports from becoming pins (:mod:`fpga.harness`), the multi-config report that writes
``docs/fpga.md`` (:mod:`fpga.report`) and a ULX3S bitstream (:mod:`fpga.board`).
``python -m fpga --help`` lists the commands."""
