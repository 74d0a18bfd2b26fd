"""The controller: its blocks, connected once."""

from amaranth.hdl import Module, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..accumulator import AccumulatorSignature
from ..scratchpad import ScratchpadSignature
from ..systolic import ActivationRow
from .decoder import Decoder
from .fetcher import Fetcher
from .issue import IssueStage
from .load_unit import LoadUnit
from .signatures import HostLinkSignature, ReaderSignature, WriterSignature
from .store_unit import StoreUnit
from .streamer import Streamer
from .weight_loader import WeightLoader


__all__ = ["Controller"]


class Controller(wiring.Component):
    """Runs a compiled instruction stream (:mod:`hw.isa`) on the array, memories and DMA.

    The fetcher reads the program ahead into a queue; the decoder checks the instruction at
    its head; the issue stage takes instructions in program order and hands each to one of
    four units, which then run side by side:

    * the load unit (``LOAD_SPAD``, ``LOAD_ACC``, ``LOAD_QUANT``) on the DMA reader, which
      it shares with the fetcher;
    * the weight loader (``PRELOAD``) on the scratchpad's weight read port, filling the
      shadow weights while the array computes with the active ones;
    * the streamer (``MATMUL``) on the activation read port, with up to two ``MATMUL`` s in
      the array: the next streams in right behind the last row of the one before;
    * the store unit (``STORE``, ``STORE_Q``) on the accumulator's read port and the DMA
      writer.

    Parameters
    ----------
    config : NPUConfig
    read_row_bytes : int
        Width of the DMA reader's rows.

    Attributes
    ----------
    host : Out(HostLinkSignature())
        To the host registers.
    soft_reset_pending : Out(1)
        A soft reset waits for the DMA to be idle; no unit starts a bus transaction.
    soft_reset : In(1)
        The core reset (:class:`hw.top.NPU`): resets every block of the controller as the
        domain's reset does, one cycle later. It is registered once per block
        (``core_reset_<block>``), each copy reaching only its block's flip-flops, so that
        no one flip-flop drives a reset to the whole controller (on the FPGA the store
        unit's requantization state, placed by the requantizers' lanes, was at the end of
        a route of 17 ns from the one copy).
    bus_timeout : In(1)
        The bus watchdog expired (:class:`hw.watchdog.BusWatchdog`): the run ends with
        ``BUS_TIMEOUT`` (:class:`~.issue.IssueStage`).
    reader : Out(ReaderSignature), writer : Out(WriterSignature)
        To the DMA.
    spad : In(ScratchpadSignature), acc : In(AccumulatorSignature)
    act, weight : Out(stream) to the array; result : In(stream) from it
    """
    def __init__(self, config, *, read_row_bytes):
        self.config = config
        self.read_row_bytes = read_row_bytes
        rows, cols = config.rows, config.cols
        super().__init__({
            "host":               Out(HostLinkSignature()),
            "soft_reset_pending": Out(1),
            "soft_reset":         In(1),
            "bus_timeout":        In(1),
            "reader":             Out(ReaderSignature(8 * read_row_bytes)),
            "writer":             Out(WriterSignature(8 * config.acc_row_bytes)),
            "spad":               In(ScratchpadSignature(config.spad_depth,
                                                         config.spad_row_bytes)),
            "acc":                In(AccumulatorSignature(config.acc_depth, cols)),
            "act":                Out(stream.Signature(ActivationRow(rows), always_ready=True)),
            "weight":             Out(stream.Signature(data.ArrayLayout(signed(8), cols),
                                                       always_ready=True)),
            "result":             In(stream.Signature(data.ArrayLayout(signed(32), cols),
                                                      always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        config = self.config

        def block(name, component):
            reset = Signal(name=f"core_reset_{name}")
            m.d.sync += reset.eq(self.soft_reset)
            m.submodules[name] = ResetInserter(reset)(component)
            return component

        fetcher = block("fetcher", Fetcher(read_row_bytes=self.read_row_bytes,
                                             bus_bytes=config.bus_bytes))
        decoder = block("decoder", Decoder(config))
        issue = block("issue_stage", IssueStage(config))
        load_unit = block("load_unit", LoadUnit(config, read_row_bytes=self.read_row_bytes))
        weight_loader = block("weight_loader", WeightLoader(config))
        streamer = block("streamer", Streamer(config))
        store_unit = block("store_unit", StoreUnit(config))

        wiring.connect(m, wiring.flipped(self.host), issue.host)
        m.d.comb += [self.soft_reset_pending.eq(issue.soft_reset_pending),
                     issue.bus_timeout.eq(self.bus_timeout)]

        wiring.connect(m, issue.fetch, fetcher.control)
        wiring.connect(m, wiring.flipped(self.reader), fetcher.reader)
        wiring.connect(m, fetcher.words, decoder.words)
        wiring.connect(m, decoder.decoded, issue.decoded)
        wiring.connect(m, decoder.next, issue.next_head)

        wiring.connect(m, issue.load, load_unit.issue)
        wiring.connect(m, issue.weights, weight_loader.issue)
        wiring.connect(m, issue.stream, streamer.issue)
        wiring.connect(m, issue.store, store_unit.issue)

        wiring.connect(m, load_unit.reader, fetcher.load)
        wiring.connect(m, load_unit.spad, wiring.flipped(self.spad.write))
        wiring.connect(m, load_unit.acc, streamer.load_acc)
        wiring.connect(m, load_unit.quant, store_unit.quant)

        wiring.connect(m, weight_loader.spad, wiring.flipped(self.spad.weight))
        wiring.connect(m, weight_loader.weight, wiring.flipped(self.weight))
        wiring.connect(m, weight_loader.commit, streamer.commit)

        wiring.connect(m, streamer.spad, wiring.flipped(self.spad.act))
        wiring.connect(m, streamer.act, wiring.flipped(self.act))
        wiring.connect(m, wiring.flipped(self.result), streamer.result)
        wiring.connect(m, streamer.acc, wiring.flipped(self.acc.write))

        wiring.connect(m, store_unit.acc, wiring.flipped(self.acc.read))
        wiring.connect(m, store_unit.writer, wiring.flipped(self.writer))
        return m
