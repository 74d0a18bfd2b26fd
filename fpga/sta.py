"""Static timing of a routed build from nextpnr's SDF: every endpoint's slack, and the
failing endpoints grouped by where their paths start and end in the RTL.

nextpnr's report names one critical path per clock; after a change takes that path apart,
the next run names another, a place and route later. The SDF that :func:`fpga.flow.run`
writes (``npu.sdf``) holds every cell's delays (``IOPATH``), every routed connection's
(``INTERCONNECT``) and every register's setup (``SETUPHOLD``), so one run can list them all.
Each endpoint's worst path is traced back to the register it starts from; endpoints are
grouped by the Python source lines (the netlist's ``src`` attributes, as in the report's
critical path) of their start and end registers.

This is a small single-clock analysis, no replacement for a sign-off tool: worst (max)
delays only, every register on the one clock, no clock skew (nextpnr's ECP5 model has none
on the global clock either), setup checks only. On the whole 8x8 NPU its worst path agrees
with nextpnr's critical path (tb/test_fpga.py checks the arithmetic on a small SDF).

``python -m fpga.sta <build folder> [--period NS] [--top N] [--paths]``
"""

import argparse
import collections
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path


__all__ = ["TimingGraph", "Endpoint", "read_sdf", "analyze", "group", "main"]


def _unescape(name):
    return re.sub(r"\\(.)", r"\1", name)


def _worst(triple):
    """The max of an SDF ``min:typ:max`` triple, in ns (the file's time scale is 1 ps)."""
    return int(triple.split(":")[-1]) / 1000.0


@dataclass
class TimingGraph:
    """Pins ``(instance, pin)`` and their delays: ``edges[pin]`` lists ``(next pin, ns,
    kind)`` (``"logic"`` through a cell, ``"route"`` between cells); ``starts[pin]`` is the
    clock-to-output delay of a register's output; ``setups[pin]`` a register input's setup."""
    edges: dict = field(default_factory=lambda: collections.defaultdict(list))
    starts: dict = field(default_factory=dict)
    setups: dict = field(default_factory=dict)


@dataclass
class Endpoint:
    """A register input, its slack at the period, and its worst path: the start pin and the
    steps ``(kind, ns, pin)`` after the clock-to-output delay."""
    pin: tuple
    slack: float
    arrival: float
    start: tuple
    steps: list

    @property
    def routing(self):
        return round(sum(ns for kind, ns, _ in self.steps if kind == "route"), 3)

    @property
    def logic(self):
        """Clock to output, cells and setup."""
        return round(self.arrival - self.routing, 3)


_NAME = r"((?:\\.|[^\s()\\])+)"
_CELL = re.compile(r"\s+\(CELLTYPE \"([^\"]+)\"\)\s+\(INSTANCE ?" + _NAME + r"?\)(.*)", re.S)
_SETUP = re.compile(r"\(SETUPHOLD \((?:posedge|negedge) ([^\s)]+)\) "
                    r"\((?:posedge|negedge) ([^\s)]+)\) \(([\d:]+)\) \(([\d:]+)\)\)")
_IOPATH = re.compile(r"\(IOPATH (\(posedge [^)]+\)|\S+) (\S+) \(([\d:]+)\)")
_INTERCONNECT = re.compile(r"\(INTERCONNECT " + _NAME + " " + _NAME + r" \(([\d:]+)\)")


def read_sdf(text):
    """The :class:`TimingGraph` of an SDF as nextpnr writes it. A path from a clock pin
    (``CLK...`` or ``(posedge ...)``) is a register's clock-to-output; connections into
    clock pins (the clock network) are left out."""
    graph = TimingGraph()
    clock_pins = set()
    for chunk in text.split("\n  (CELL")[1:]:
        cell = _CELL.match(chunk)
        if cell is None:
            raise ValueError(f"SDF cell not understood: {chunk[:80]!r}")
        instance = _unescape(cell[2]) if cell[2] else ""
        body = cell[3]
        for check in _SETUP.finditer(body):
            pin = (instance, check[1])
            clock_pins.add((instance, check[2]))
            graph.setups[pin] = max(graph.setups.get(pin, 0.0), _worst(check[3]))
        for path in _IOPATH.finditer(body):
            source, sink, delay = path[1], path[2], _worst(path[3])
            edge = re.fullmatch(r"\(posedge (\S+)\)", source)
            if edge or source.startswith("CLK"):
                clock_pins.add((instance, edge[1] if edge else source))
                pin = (instance, sink)
                graph.starts[pin] = max(graph.starts.get(pin, 0.0), delay)
            else:
                graph.edges[(instance, source)].append(((instance, sink), delay, "logic"))
        for wire in _INTERCONNECT.finditer(body):
            source, sink = _unescape(wire[1]).rpartition("/"), _unescape(wire[2]).rpartition("/")
            graph.edges[(source[0], source[2])].append(
                ((sink[0], sink[2]), _worst(wire[3]), "route"))
    for pin, edges in graph.edges.items():
        edges[:] = [edge for edge in edges if edge[0] not in clock_pins]
    return graph


def analyze(graph, period_ns):
    """Every endpoint with an arrival, worst slack first."""
    pins = set(graph.edges) | set(graph.starts) | {edge[0] for edges in graph.edges.values()
                                                   for edge in edges}
    fanin = collections.Counter(edge[0] for edges in graph.edges.values() for edge in edges)
    arrival = dict(graph.starts)
    worst_in = {}
    ready = collections.deque(pin for pin in pins if fanin[pin] == 0)
    ordered = 0
    while ready:
        pin = ready.popleft()
        ordered += 1
        for sink, delay, kind in graph.edges.get(pin, ()):
            if pin in arrival and arrival[pin] + delay > arrival.get(sink, -1.0):
                arrival[sink] = arrival[pin] + delay
                worst_in[sink] = (pin, delay, kind)
            fanin[sink] -= 1
            if fanin[sink] == 0:
                ready.append(sink)
    if ordered != len(pins):
        raise ValueError(f"combinational loop: {len(pins) - ordered} pins not ordered")
    endpoints = []
    for pin, setup in graph.setups.items():
        if pin not in arrival:
            continue
        steps, start = [], pin
        while start in worst_in:
            previous, delay, kind = worst_in[start]
            steps.append((kind, delay, start))
            start = previous
        steps.reverse()
        endpoints.append(Endpoint(pin, round(period_ns - setup - arrival[pin], 3),
                                  round(arrival[pin] + setup, 3), start, steps))
    endpoints.sort(key=lambda endpoint: endpoint.slack)
    return endpoints


def sources(netlist):
    """``instance -> "hw/file.py:N"`` for the cells of a Yosys JSON netlist with a source in
    ``hw/`` (or else any Python source)."""
    names = {}
    for name, cell in netlist["modules"]["top"]["cells"].items():
        src = cell.get("attributes", {}).get("src", "")
        found = (re.findall(r"(hw/[^|:]+\.py):(\d+)", src) or
                 re.findall(r"([^/|:]+\.py):(\d+)", src))
        names[name] = (",".join(sorted({f"{file}:{line}" for file, line in found}))
                       or cell["type"])
    return names


_MADE_UP = re.compile(r"TRELLIS|LUT4|CCU2C|PFUMX|L6MUX|MULT18|DP16KD|\$")


def registers(netlist):
    """``instance -> register`` for the flip-flop cells of a Yosys JSON netlist: the name
    of the RTL signal its output is a bit of (the shortest net name on that bit that Yosys
    did not make up), without the design's prefix: ``dma.reader.ar_rows_left``."""
    top = netlist["modules"]["top"]
    names = {}
    for name, net in top["netnames"].items():
        if _MADE_UP.search(name):
            continue
        for bit in net["bits"]:
            if isinstance(bit, int) and (bit not in names or len(name) < len(names[bit])):
                names[bit] = name
    found = {}
    for instance, cell in top["cells"].items():
        q = cell.get("connections", {}).get("Q")
        if cell["type"] == "TRELLIS_FF" and q and q[0] in names:
            found[instance] = re.sub(r"^design\.(controller\.)?", "", names[q[0]])
    return found


def into(members, regs, count=3):
    """The registers most of a group's endpoints are in, most first: ``[(name, n)]``; a
    trailing lane or copy number counts as ``*`` (``requant.round_up_8_*``), and a
    flip-flop whose output kept no RTL name (Yosys made up every name on it: a cell name
    then tells more of ABC than of the design) is ``unnamed``."""
    return collections.Counter(re.sub(r"_\d+$", "_*", regs.get(e.pin[0], "unnamed"))
                               for e in members).most_common(count)


def group(endpoints, names):
    """Failing endpoints by ``(start source, end source)``, the group with the worst slack
    first; each group's endpoints worst first."""
    groups = collections.defaultdict(list)
    for endpoint in endpoints:
        if endpoint.slack < 0:
            key = (names.get(endpoint.start[0], endpoint.start[0]),
                   names.get(endpoint.pin[0], endpoint.pin[0]))
            groups[key].append(endpoint)
    return sorted(groups.items(), key=lambda item: item[1][0].slack)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fpga.sta", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("build", type=Path, help="a build folder of fpga.flow (npu.sdf, "
                                                 "npu.json)")
    parser.add_argument("--period", type=float, default=8.0,
                        help="clock period in ns (default 8.0: 125 MHz)")
    parser.add_argument("--top", type=int, default=30, help="groups to list (default 30)")
    parser.add_argument("--paths", action="store_true", help="each group's worst path")
    parser.add_argument("--registers", action="store_true",
                        help="the registers each group's endpoints are in")
    args = parser.parse_args(argv)
    for name in ("npu.sdf", "npu.json"):
        if not (args.build / name).exists():
            parser.error(f"{args.build / name} not found: run the flow there first")
    graph = read_sdf((args.build / "npu.sdf").read_text())
    endpoints = analyze(graph, args.period)
    netlist = json.loads((args.build / "npu.json").read_text())
    names = sources(netlist)
    regs = registers(netlist) if args.registers else {}
    failing = [endpoint for endpoint in endpoints if endpoint.slack < 0]
    worst = endpoints[0] if endpoints else None
    print(f"{args.build}: {len(failing)} of {len(endpoints)} endpoints miss {args.period} ns"
          + (f"; worst path {worst.arrival:.2f} ns ({1000 / worst.arrival:.1f} MHz)"
             if worst else ""))
    for (start, end), members in group(endpoints, names)[:args.top]:
        path = members[0]
        longest = max((ns for kind, ns, _ in path.steps if kind == "route"), default=0.0)
        print(f"{len(members):6d}  {path.slack:6.2f} ns  {start} -> {end}  (logic "
              f"{path.logic:.1f}, routing {path.routing:.1f}, longest route {longest:.1f})")
        if args.registers:
            print("          into " + ", ".join(f"{name} ({n})"
                                                for name, n in into(members, regs)))
        if args.paths:
            for kind, ns, (instance, pin) in path.steps:
                print(f"          {kind:5s} {ns:5.2f}  {instance}/{pin}")


if __name__ == "__main__":
    sys.exit(main())
