"""The NPU in its LiteX SoC (soc/), driven by the board backend (sw/board.py).

The host side alone: program relocation and the rows a program stores. The whole path in
simulation: a 2x2 NPU in the SoC (UART bridge, LiteDRAM with its SDRAM model) under
Verilator, reached over a TCP socket by the code that drives a board, runs a GEMM and a
quantized convolution bit-exactly; a byte corrupted on the link in either direction, a link
that does not answer and a board of another config each end in a one-line error.
"""

import os
import socket
import threading

import numpy as np
import pytest

from hw.config import NPUConfig
from hw.isa import Opcode
from quant_cases import random_conv_problem
from soc.memory_map import DRAM_BASE
from sw import board, codec
from sw.conv import conv2d
from sw.driver import gemm, prepare_gemm
from sw.errors import LinkError, NPUValueError
from sw.reference import reference_conv2d, reference_gemm


SEED = int(os.environ.get("NPU_SEED", "20261207"))
CONFIG = NPUConfig.from_name("2x2")


def _gemm_job(m=5, k=7, n=3, seed=SEED):
    rng = np.random.default_rng(seed)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    return a, b, prepare_gemm(a, b, config=CONFIG)


def test_relocate_moves_every_dram_address_and_nothing_else():
    _, _, job = _gemm_job()
    prog_addr, length = job.layout.program_addr, len(job.program)
    moved = board.relocate(job.dram, prog_addr, length, DRAM_BASE)
    assert len(moved) == len(job.dram)
    program = slice(prog_addr, prog_addr + 16 * length)
    outside = np.ones(len(job.dram), bool)
    outside[program] = False
    assert np.array_equal(moved[outside], job.dram[outside])
    before = codec.unpack_words(job.dram[program].tobytes())
    after = codec.unpack_words(moved[program].tobytes())
    seen = set()
    for old, new in zip(before, after):
        opcode, fields = codec.decode(old)
        new_opcode, new_fields = codec.decode(new)
        assert new_opcode == opcode
        if "dram_addr" in fields:
            seen.add(opcode)
            assert new_fields == {**fields, "dram_addr": fields["dram_addr"] + DRAM_BASE}
        else:
            assert new == old
    assert {Opcode.LOAD_SPAD, Opcode.STORE} <= seen


def test_relocate_refuses_an_address_beyond_32_bits():
    image = np.zeros(64, np.uint8)
    words = [codec.encode(Opcode.LOAD_SPAD, local_addr=0, rows=1, row_bytes=4,
                          dram_addr=0xF000_0000, dram_stride=4), codec.encode(Opcode.END)]
    image[:32] = np.frombuffer(codec.pack_words(words), np.uint8)
    with pytest.raises(NPUValueError, match="beyond the SoC's 32-bit space"):
        board.relocate(image, 0, 2, DRAM_BASE)


def test_stored_regions_are_the_stores_rows():
    words = [codec.encode(Opcode.STORE, acc_addr=0, rows=3, row_bytes=8, dram_addr=256,
                          dram_stride=16),
             codec.encode(Opcode.STORE_Q, acc_addr=0, rows=2, row_bytes=2, dram_addr=260,
                          dram_stride=4),
             codec.encode(Opcode.END),
             codec.encode(Opcode.STORE, acc_addr=0, rows=1, row_bytes=4, dram_addr=400,
                          dram_stride=4)]      # after END: never runs
    image = np.zeros(512, np.uint8)
    image[:64] = np.frombuffer(codec.pack_words(words), np.uint8)
    # STORE: 256-264, 272-280, 288-296; STORE_Q: 260-262, 264-266 (merged into the first).
    assert board.stored_regions(image, 0, 4) == [(256, 266), (272, 280), (288, 296)]


def test_gemm_on_the_simulated_soc():
    a, b, _ = _gemm_job(m=9, k=6, n=5)
    print(f"seed {SEED}")
    result = gemm(a, b, config=CONFIG, sim="soc")
    assert np.array_equal(result.c, reference_gemm(a, b))
    assert result.perf["useful_macs"] == 9 * 6 * 5
    assert result.perf["instructions"] == result.instructions
    assert result.cycles == result.perf["cycles"] > 0
    # The image went over the link, each burst read back: at least twice its bytes.
    assert result.link["tx_bytes"] > len(a.tobytes()) + len(b.tobytes())
    assert result.link["rx_bytes"] > 0


def test_quantized_convolution_on_the_simulated_soc():
    rng = np.random.default_rng(SEED + 1)
    print(f"seed {SEED + 1}")
    problem = random_conv_problem(rng, 1, 5, 4, 3, 2, 3, padding=1, float_mode=True)
    result = conv2d(**problem, config=CONFIG, sim="soc")
    assert np.array_equal(result.y, reference_conv2d(**problem))


class _Proxy:
    """A TCP relay between the host and the simulated SoC that flips one bit of one byte:
    the ``offset``-th byte of the first chunk of at least ``size`` bytes going ``direction``
    ("to_soc" or "to_host")."""

    def __init__(self, target, direction, size, offset):
        host, port = target.removeprefix("socket://").split(":")
        self.target = (host, int(port))
        self.direction, self.size, self.offset = direction, size, offset
        self.flipped = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"socket://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        threading.Thread(target=self._pump, args=(client, server, "to_soc"),
                         daemon=True).start()
        self._pump(server, client, "to_host")

    def _pump(self, source, sink, direction):
        while True:
            try:
                data = bytearray(source.recv(4096))
            except OSError:
                return
            if not data:
                return
            if (direction == self.direction and not self.flipped and
                    len(data) >= self.size):
                data[self.offset] ^= 0x10
                self.flipped = True
            try:
                sink.sendall(data)
            except OSError:
                return


@pytest.mark.parametrize("direction, size, offset", [
    ("to_soc", 500, 100),     # inside the data of the image's first long write burst
    ("to_host", 500, 100),    # inside a long read burst's answer
])
def test_a_byte_corrupted_on_the_link_is_an_error(direction, size, offset):
    from soc.simulation import SimulatedSoC
    a, b, job = _gemm_job(m=40, k=8, n=6)
    with SimulatedSoC(CONFIG) as soc:
        proxy = _Proxy(soc.url, direction, size, offset)
        description = board.load_description(soc.description, CONFIG)
        with pytest.raises(LinkError, match="the link corrupted a (write|read)") as caught:
            board._run_all(proxy.url, CONFIG, [(job.dram, job.layout.program_addr,
                                                len(job.program))], description)
    assert proxy.flipped
    assert "\n" not in str(caught.value)


def test_a_link_that_does_not_answer_is_an_error(monkeypatch):
    monkeypatch.setattr(board, "ANSWER_SECONDS", 0.5)
    silent = socket.create_server(("127.0.0.1", 0))
    url = f"socket://127.0.0.1:{silent.getsockname()[1]}"
    try:
        with board.BoardLink(url) as link:
            with pytest.raises(LinkError, match="no answer from") as caught:
                board.BoardNPU(link).probe()
    finally:
        silent.close()
    assert "\n" not in str(caught.value)


def test_a_missing_port_is_an_error():
    with pytest.raises(LinkError, match="cannot open /dev/npu-no-such-port"):
        board.BoardLink("/dev/npu-no-such-port")


def test_through_litex_server():
    """``tcp://``: LiteX's own litex_server owns the UART (here the simulated SoC's socket)
    and the backend reaches it with LiteX's RemoteClient; a GEMM runs bit-exactly."""
    import subprocess
    import sys
    import time
    from soc.simulation import SimulatedSoC
    a, b, job = _gemm_job(m=6, k=5, n=4)
    port = socket.create_server(("127.0.0.1", 0))
    bind_port = port.getsockname()[1]
    port.close()
    server_script = os.path.join(os.path.dirname(sys.executable), "litex_server")
    with SimulatedSoC(CONFIG) as soc:
        server = subprocess.Popen([sys.executable, server_script, "--uart", "--uart-port",
                                   soc.url, "--bind-ip", "127.0.0.1", "--bind-port",
                                   str(bind_port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", bind_port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "litex_server did not start"
                    time.sleep(0.2)
            description = board.load_description(soc.description, CONFIG)
            [result] = board._run_all(f"tcp://127.0.0.1:{bind_port}", CONFIG,
                                      [(job.dram, job.layout.program_addr, len(job.program))],
                                      description)
        finally:
            server.terminate()
            server.wait(timeout=10)
    assert result.done and result.link is None
    assert np.array_equal(job.finish(result, CONFIG, "soc").c, reference_gemm(a, b))


def test_the_board_must_be_the_config_asked_for():
    from soc.simulation import SimulatedSoC
    with SimulatedSoC(CONFIG) as soc, board.BoardLink(soc.url) as link:
        npu = board.BoardNPU(link)
        assert npu.probe()["config"] == CONFIG
        with pytest.raises(NPUValueError, match="the board's NPU is 2x2.*not the 3x3"):
            npu.check(NPUConfig.from_name("3x3"))


def test_without_the_link_checks_a_corrupted_byte_goes_unnoticed(monkeypatch):
    """The mutant: the link's read-backs and double reads turned off. The same corruption as
    above then ends in a wrong product with no error, which is what the checks prevent."""
    from soc.simulation import SimulatedSoC

    def write_words(self, addr, words):
        for offset in range(0, len(words), board.BURST_WORDS):
            self._timed(self.client.write, addr + 4 * offset,
                        list(words[offset:offset + board.BURST_WORDS]))
            # One word read, not compared: it only paces the writes, as the read-back does
            # (LiteX's serial2tcp holds 2 KiB).
            self._timed(self.client.read, addr, 1)

    original_read = board.BoardLink.read_words
    monkeypatch.setattr(board.BoardLink, "write_words", write_words)
    monkeypatch.setattr(board.BoardLink, "read_words",
                        lambda self, addr, count, verify=True: original_read(
                            self, addr, count, verify=False))
    a, b, job = _gemm_job(m=40, k=8, n=6)
    with SimulatedSoC(CONFIG) as soc:
        proxy = _Proxy(soc.url, "to_soc", 500, 100)
        description = board.load_description(soc.description, CONFIG)
        [result] = board._run_all(proxy.url, CONFIG, [(job.dram, job.layout.program_addr,
                                                       len(job.program))], description)
    assert proxy.flipped and result.done
    assert not np.array_equal(job.finish(result, CONFIG, "soc").c, reference_gemm(a, b))
