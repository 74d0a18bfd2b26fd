"""Logic levels after a net, in a synthesized netlist (Yosys' ECP5 JSON, ``npu.json``): for
every flip-flop pin (data, clock enable, reset) the net reaches through logic, how many LUTs
it passes on the way, grouped by pin, level and the flip-flop's RTL source line.

A routed build says how long a path was (:mod:`fpga.sta`); this says how deep synthesis made
the logic behind it, before any placement: whether a term written to be one LUT from its
flip-flops is one LUT in the netlist, or ABC put a shared LUT before it. A LUT4 counts 1,
the wide-LUT muxes (PFUMX, L6MUX21) 0.5 each, a carry cell (CCU2C) 0.3; other cells (block
RAM, DSP) end the walk.

``python -m fpga.levels <build folder> <net regex> [--top N]``; the regex is matched
against the whole hierarchical net name (``design.controller.issue_stage.lut_term_ready_b``
matches ``.*lut_term_ready_b``).
"""

import argparse
import collections
import json
import re
import sys
from pathlib import Path

from .sta import sources


__all__ = ["LEVELS", "levels_after", "main"]

#: The LUT levels a cell adds, by type; other cells end the walk (flip-flops are the pins).
LEVELS = {"LUT4": 1.0, "PFUMX": 0.5, "L6MUX21": 0.5, "CCU2C": 0.3}


def levels_after(netlist, pattern):
    """``Counter`` of ``(pin, levels, source)`` for every flip-flop pin reached from the nets
    whose names match ``pattern`` (the deepest way to each pin). ``source`` is the
    flip-flop's RTL line as :func:`fpga.sta.sources` names it (``hw/file.py:N``)."""
    top = netlist["modules"]["top"]
    rx = re.compile(pattern)
    start = {bit for name, net in top["netnames"].items() if rx.fullmatch(name)
             for bit in net["bits"] if isinstance(bit, int)}
    if not start:
        raise ValueError(f"no net of the netlist matches {pattern!r}")
    loads = collections.defaultdict(list)
    for name, cell in top["cells"].items():
        for port, bits in cell["connections"].items():
            if cell.get("port_directions", {}).get(port) == "input":
                for bit in bits:
                    if isinstance(bit, int):
                        loads[bit].append((name, cell, port))
    deepest = {bit: 0.0 for bit in start}
    pins = {}
    work = list(start)
    while work:
        bit = work.pop()
        level = deepest[bit]
        for name, cell, port in loads[bit]:
            kind = cell["type"]
            if kind in LEVELS:
                for out, direction in cell["port_directions"].items():
                    if direction != "output":
                        continue
                    for out_bit in cell["connections"][out]:
                        after = level + LEVELS[kind]
                        if isinstance(out_bit, int) and deepest.get(out_bit, -1) < after:
                            deepest[out_bit] = after
                            work.append(out_bit)
            elif kind == "TRELLIS_FF":
                pins[name, port] = max(level, pins.get((name, port), level))
    names = sources(netlist)
    return collections.Counter((port, level, names[name])
                               for (name, port), level in pins.items())


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fpga.levels", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("build", type=Path, help="a build folder of fpga.flow (npu.json)")
    parser.add_argument("net", help="regex of the net names to start from")
    parser.add_argument("--top", type=int, default=30, help="rows to list (default 30)")
    args = parser.parse_args(argv)
    path = args.build / "npu.json"
    if not path.exists():
        parser.error(f"{path} does not exist (run python -m fpga run --synth-only first)")
    try:
        found = levels_after(json.loads(path.read_text()), args.net)
    except ValueError as error:
        parser.error(str(error))
    print(f"{args.build}: flip-flop pins after {args.net!r}, deepest first")
    rows = sorted(found.items(), key=lambda item: (-item[0][1], -item[1]))
    for (pin, level, source), count in rows[:args.top]:
        print(f"  {level:4.1f} levels  {pin:3s} {count:5d}  {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
