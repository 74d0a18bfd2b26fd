"""Running compiled programs on the NPU in its LiteX SoC: on a board, or on the simulated SoC.

The host reaches the SoC through LiteX's UART bridge (UARTBone): :class:`BoardLink` speaks its
protocol with LiteX's own client (``CommUART``, over a serial port such as ``/dev/ttyUSB0`` or
any pyserial URL, ``socket://127.0.0.1:PORT`` for the simulated SoC), or with LiteX's
``RemoteClient`` through a ``litex_server`` (``tcp://HOST:PORT``). :class:`BoardNPU` runs a
program as the simulators do, and returns the same :class:`~sim.result.RunResult`:

1. it checks that an NPU answers at :data:`soc.memory_map.NPU_BASE` and that it is the
   config asked for (its identification registers);
2. it relocates the program to the SoC's SDRAM (:func:`relocate`: every DRAM address in it
   moves by :data:`soc.memory_map.DRAM_BASE`) and writes the DRAM image there;
3. it sets ``PROG_ADDR`` and ``PROG_LEN``, starts, and polls ``STATUS`` until done or error;
4. it reads the cycle and performance counters, and the rows the program stored (found in
   the program's ``STORE``/``STORE_Q`` instructions; the NPU writes nowhere else).

Nothing the link corrupts goes unnoticed: every burst written is read back and compared,
every register written is read back, and every burst read is read twice and compared; a
difference is a :class:`LinkError`, never a silently wrong result. Both the board and the
simulated SoC use this code; only the URL differs.
"""

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hw.config import NPUConfig
from hw.isa import (Control, ErrorCode, INSTR_BYTES, MAGIC, Opcode, PERF_COUNTERS, Reg,
                    Status, VERSION)
from sim.result import RunResult
from soc.memory_map import BAUDRATE, DRAM_BASE, DRAM_SIZE, NPU_BASE

from .codec import decode, encode
from .errors import LinkError, NPUValueError


__all__ = ["BAUDRATE", "BoardLink", "BoardNPU", "LinkStats", "relocate", "stored_regions",
           "run_on_board", "run_on_simulated_soc", "BOARD_ENV", "SOC_ENV", "load_description",
           "find_description"]


#: Words in one burst of the UART bridge (its length field is a byte).
BURST_WORDS = 255
#: The environment variable that names the board's link for ``sim="board"`` (the CLI's
#: ``--port`` sets it).
BOARD_ENV = "NPU_BOARD"
#: The environment variable that names the SoC's description (``soc.json``, the CLI's ``--soc``).
SOC_ENV = "NPU_BOARD_SOC"
#: Seconds without an answer before the link is declared dead.
ANSWER_SECONDS = 5.0
#: Seconds a program may run on the board before the run is declared hung (the NPU's own
#: bus watchdog ends a program whose bus does not answer long before this).
PROGRAM_SECONDS = float(os.environ.get("NPU_BOARD_TIMEOUT", "600"))


@dataclass
class LinkStats:
    """Bytes moved over the link and the time spent moving them."""
    tx_bytes: int = 0
    rx_bytes: int = 0
    seconds: float = 0.0

    def at_baudrate(self, baudrate=BAUDRATE):
        """Seconds these bytes take on a UART at ``baudrate`` (10 bits a byte: start, 8 data,
        stop), each direction on its own wire."""
        return max(self.tx_bytes, self.rx_bytes) * 10 / baudrate

    def as_dict(self):
        return {"tx_bytes": self.tx_bytes, "rx_bytes": self.rx_bytes,
                "seconds": self.seconds, "seconds_at_3mbaud": self.at_baudrate()}


def _uart_client(url, baudrate, stats):
    """LiteX's ``CommUART`` with a timeout on every answer, byte counters and bursts as long
    as the bridge takes (``CommUART.write`` cuts them at 8 words)."""
    from litex.tools.remote import comm_uart

    class Client(comm_uart.CommUART):
        def _read(self, length):
            data = b""
            deadline = time.monotonic() + ANSWER_SECONDS
            while len(data) < length:
                data += self.port.read(length - len(data))
                if len(data) < length and time.monotonic() > deadline:
                    raise LinkError(f"no answer from {url} within {ANSWER_SECONDS:g} s "
                                    f"({len(data)} of {length} bytes): is the SoC's bitstream "
                                    f"loaded, and is this its UART?")
            stats.rx_bytes += length
            return data

        def _write(self, data):
            super()._write(bytes(data))
            stats.tx_bytes += len(data)

        def write(self, addr, data, burst="incr"):
            data = data if isinstance(data, list) else [data]
            for offset in range(0, len(data), BURST_WORDS):
                words = data[offset:offset + BURST_WORDS]
                header = bytes([comm_uart.CMD_WRITE_BURST_INCR, len(words)])
                header += (addr // 4 + offset).to_bytes(self.addr_bytes, "big")
                self._write(header + b"".join(w.to_bytes(4, "big") for w in words))

        def read(self, addr, length=None, burst="incr"):
            count = 1 if length is None else length
            self._write(bytes([comm_uart.CMD_READ_BURST_INCR, count]) +
                        (addr // 4).to_bytes(self.addr_bytes, "big"))
            data = self._read(4 * count)
            words = [int.from_bytes(data[4 * i:4 * i + 4], "big") for i in range(count)]
            return words[0] if length is None else words

    try:
        client = Client(url, baudrate)
    except Exception as error:   # pyserial's SerialException, or OSError from a socket URL
        raise LinkError(f"cannot open {url}: {error}") from None
    client.port.timeout = 0.2
    return client


def _tcp_client(url):
    """LiteX's ``RemoteClient``, through a ``litex_server`` at ``tcp://HOST:PORT``."""
    from litex.tools.litex_client import RemoteClient
    host, _, port = url.removeprefix("tcp://").partition(":")
    client = RemoteClient(host=host or "localhost", port=int(port or 1234))
    try:
        client.open()
    except OSError as error:
        raise LinkError(f"cannot reach litex_server at {url}: {error}") from None
    client.socket.settimeout(ANSWER_SECONDS)
    return client


class BoardLink:
    """The host's link to the SoC's bus.

    Parameters
    ----------
    url : str
        ``/dev/ttyUSB0`` (or any pyserial port or URL, ``socket://HOST:PORT`` among them) for
        the UART bridge; ``tcp://HOST:PORT`` for a ``litex_server``.
    baudrate : int
        The UART's (:data:`BAUDRATE`); a socket ignores it.

    Attributes
    ----------
    stats : LinkStats or None
        The bytes on the UART; ``None`` through a ``litex_server``, which owns the UART and
        does not report them.
    """
    def __init__(self, url, *, baudrate=BAUDRATE):
        if not isinstance(url, str) or not url:
            raise NPUValueError(f"the board's port must be a device or URL, not {url!r}")
        self.url = url
        if url.startswith("tcp://"):
            self.stats = None
            self.client = _tcp_client(url)
        else:
            self.stats = LinkStats()
            self.client = _uart_client(url, baudrate, self.stats)

    def close(self):
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _timed(self, operation, *args):
        started = time.perf_counter()
        try:
            return operation(*args)
        except LinkError:
            raise
        except (OSError, TimeoutError) as error:
            raise LinkError(f"the link to {self.url} failed: {error}") from None
        finally:
            if self.stats is not None:
                self.stats.seconds += time.perf_counter() - started

    def read_words(self, addr, count, *, verify=True):
        """``count`` 32-bit words from byte address ``addr``; read twice and compared unless
        ``verify`` is false."""
        words = []
        for offset in range(0, count, BURST_WORDS):
            length = min(BURST_WORDS, count - offset)
            first = self._timed(self.client.read, addr + 4 * offset, length)
            if verify:
                again = self._timed(self.client.read, addr + 4 * offset, length)
                if again != first:
                    index = next(i for i in range(length) if first[i] != again[i])
                    raise LinkError(f"the link corrupted a read: the word at "
                                    f"{addr + 4 * (offset + index):#010x} read "
                                    f"{first[index]:#010x}, then {again[index]:#010x}")
            words += first
        return words

    def write_words(self, addr, words):
        """Write 32-bit ``words`` from byte address ``addr``, each burst read back and
        compared (a :class:`LinkError` names the first word that differs). The read-back
        also paces the writes: the UART bridge takes no flow control, and in simulation
        LiteX's ``serial2tcp`` holds 2 KiB (a burst is at most 1,026 bytes)."""
        for offset in range(0, len(words), BURST_WORDS):
            burst = list(words[offset:offset + BURST_WORDS])
            at = addr + 4 * offset
            self._timed(self.client.write, at, burst)
            back = self._timed(self.client.read, at, len(burst))
            if back != burst:
                index = next(i for i in range(len(burst)) if back[i] != burst[i])
                raise LinkError(f"the link corrupted a write: the word at "
                                f"{at + 4 * index:#010x} was written {burst[index]:#010x} "
                                f"and reads {back[index]:#010x}")

    def write_bytes(self, addr, data):
        """Write ``data`` (its length a multiple of 4) at the word-aligned ``addr``, verified."""
        data = bytes(data)
        if addr % 4 or len(data) % 4:
            raise NPUValueError(f"the link writes whole words: address {addr:#x}, "
                                f"{len(data)} bytes")
        self.write_words(addr, np.frombuffer(data, dtype="<u4").tolist())

    def read_bytes(self, addr, length):
        """``length`` bytes from ``addr`` (any alignment), verified."""
        first = addr & ~3
        last = (addr + length + 3) & ~3
        words = self.read_words(first, (last - first) // 4)
        data = np.asarray(words, dtype="<u4").tobytes()
        return data[addr - first:addr - first + length]

    def read_reg(self, reg):
        """An NPU register, read until two reads in a row agree: ``STATUS`` and ``PC`` may
        change between two reads while a program runs, a corrupted byte would not repeat."""
        value = self.read_words(NPU_BASE + reg, 1, verify=False)[0]
        for _ in range(4):
            again = self.read_words(NPU_BASE + reg, 1, verify=False)[0]
            if again == value:
                return value
            value = again
        raise LinkError(f"the link corrupted a read: register {Reg(reg).name} read "
                        f"differently five times in a row")

    def write_word(self, addr, value, *, verify=True):
        """Write one word of the SoC's bus (a LiteX CSR or memory), read back unless
        ``verify`` is false (a strobe such as ``command_issue`` reads 0)."""
        if verify:
            self.write_words(addr, [value])
        else:
            self._timed(self.client.write, addr, [value])

    def write_reg(self, reg, value):
        """Write an NPU register; a read-write one is read back."""
        self._timed(self.client.write, NPU_BASE + reg, [value])
        if reg in (Reg.PROG_ADDR, Reg.PROG_LEN):
            back = self.read_reg(reg)
            if back != value:
                raise LinkError(f"the link corrupted a write: register {Reg(reg).name} was "
                                f"written {value:#x} and reads {back:#x}")


def relocate(image, prog_addr, prog_len, base):
    """The program of ``image`` with every DRAM address moved by ``base``.

    Walks the instructions from ``prog_addr`` up to ``END``, ``prog_len`` instructions or the
    end of the image, and adds ``base`` to the ``dram_addr`` of each load, store and
    ``LOAD_QUANT``; an illegal opcode ends the walk (the NPU stops there too). Returns a new
    ``uint8`` image (``image`` is not changed).
    """
    image = np.array(image, dtype=np.uint8, copy=True)
    for pc, (opcode, fields, offset) in enumerate(_instructions(image, prog_addr, prog_len)):
        if "dram_addr" not in fields:
            continue
        moved = fields["dram_addr"] + base
        if moved >= 1 << 32:
            raise NPUValueError(f"instruction {pc} ({opcode.name}) addresses "
                                f"{fields['dram_addr']:#x}, beyond the SoC's 32-bit space "
                                f"once moved to the SDRAM at {base:#x}")
        word = encode(opcode, **{**fields, "dram_addr": moved})
        image[offset:offset + INSTR_BYTES] = np.frombuffer(
            word.to_bytes(INSTR_BYTES, "little"), dtype=np.uint8)
    return image


def _instructions(image, prog_addr, prog_len):
    """``(opcode, fields, byte offset)`` of each legal instruction the NPU would fetch."""
    for pc in range(prog_len):
        offset = prog_addr + pc * INSTR_BYTES
        if offset + INSTR_BYTES > len(image):
            return
        word = int.from_bytes(image[offset:offset + INSTR_BYTES].tobytes(), "little")
        opcode, fields = decode(word)
        if opcode is None:
            return
        yield opcode, fields, offset
        if opcode == Opcode.END:
            return


def stored_regions(image, prog_addr, prog_len):
    """The byte ranges ``(start, stop)`` of ``image`` that the program's ``STORE`` and
    ``STORE_Q`` instructions write, merged and sorted (in the image's own addresses)."""
    ranges = []
    for opcode, fields, _ in _instructions(image, prog_addr, prog_len):
        if opcode not in (Opcode.STORE, Opcode.STORE_Q):
            continue
        for row in range(fields["rows"]):
            start = fields["dram_addr"] + row * fields["dram_stride"]
            ranges.append((start, start + fields["row_bytes"]))
    merged = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return [(start, min(stop, len(image))) for start, stop in merged if start < len(image)]


class BoardNPU:
    """The NPU of a LiteX SoC, reached through a :class:`BoardLink`.

    Parameters
    ----------
    link : BoardLink
    """
    def __init__(self, link):
        self.link = link

    def probe(self):
        """The NPU's identity: a dict of its registers and its :class:`NPUConfig`.

        Raises :class:`LinkError` when nothing answers or what answers is not the NPU."""
        magic = self.link.read_reg(Reg.MAGIC)
        if magic != MAGIC:
            raise LinkError(f"{self.link.url} answers, but there is no NPU at {NPU_BASE:#x}: "
                            f"MAGIC reads {magic:#010x}, not {MAGIC:#010x}")
        values = {reg.name.lower(): self.link.read_reg(reg)
                  for reg in (Reg.VERSION, Reg.SHAPE, Reg.SPAD_DEPTH, Reg.ACC_DEPTH,
                              Reg.BUS_WIDTH)}
        shape = values["shape"]
        config = NPUConfig(rows=shape & 0xFFFF, cols=shape >> 16,
                           spad_depth=values["spad_depth"], acc_depth=values["acc_depth"],
                           bus_width=values["bus_width"])
        return {"url": self.link.url, "magic": magic, "version": values["version"],
                "config": config, "npu_base": NPU_BASE, "dram_base": DRAM_BASE,
                "dram_size": DRAM_SIZE}

    def check(self, config):
        """Raise :class:`NPUValueError` unless the board's NPU is ``config``."""
        found = self.probe()
        if found["version"] >> 16 != VERSION >> 16:
            raise LinkError(f"the board's NPU is version {found['version']:#x}, the software "
                            f"{VERSION:#x}: rebuild the bitstream")
        if found["config"] != config:
            raise NPUValueError(f"the board's NPU is {found['config'].key()}, not the "
                                f"{config.key()} asked for (--config and --bus-width)")

    def init_sdram(self, description):
        """Initialise the SoC's SDRAM as LiteX's BIOS would (there is no CPU to do it): the
        DFI in software control, LiteDRAM's init sequence for the chip, then hardware control.
        ``description`` is the build's ``soc.json`` (:func:`load_description`)."""
        dfii = description["dfii"]
        link = self.link
        link.write_word(dfii["control"], description["dfii_software"])
        for step in description["sdram_init"]:
            link.write_word(dfii["pi0_address"], step["address"])
            link.write_word(dfii["pi0_baddress"], step["bank"])
            if "control" in step:
                link.write_word(dfii["control"], step["control"])
            else:
                link.write_word(dfii["pi0_command"], step["command"])
                link.write_word(dfii["pi0_command_issue"], 1, verify=False)
            time.sleep(step["delay_us"] * 1e-6)
        link.write_word(dfii["control"], description["dfii_hardware"])

    def run(self, image, prog_addr, prog_len):
        """Run one program as :func:`sw.backend.run_program` does; returns a
        :class:`RunResult` whose ``link`` holds this run's link figures."""
        link = self.link
        before = None if link.stats is None else LinkStats(
            link.stats.tx_bytes, link.stats.rx_bytes, link.stats.seconds)
        image = np.asarray(image, dtype=np.uint8)
        if len(image) > DRAM_SIZE:
            raise NPUValueError(f"the program and its data take {len(image)} bytes; the "
                                f"SoC's SDRAM holds {DRAM_SIZE}")
        relocated = relocate(image, prog_addr, prog_len, DRAM_BASE)
        padded = np.concatenate([relocated, np.zeros(-len(relocated) % 4, np.uint8)])
        status = link.read_reg(Reg.STATUS)
        if status & Status.BUSY:
            raise LinkError(f"the board's NPU is busy (STATUS {status:#x}): another program "
                            f"runs")
        if status & Status.ERROR:
            # The last program ended in an error (after BUS_TIMEOUT its bus transactions were
            # abandoned): a soft reset before the next start.
            link.write_reg(Reg.CONTROL, Control.SOFT_RESET)
        link.write_bytes(DRAM_BASE, padded.tobytes())
        link.write_reg(Reg.PROG_ADDR, DRAM_BASE + prog_addr)
        link.write_reg(Reg.PROG_LEN, prog_len)
        link.write_reg(Reg.CONTROL, Control.START)
        deadline = time.monotonic() + PROGRAM_SECONDS
        while True:
            status = link.read_reg(Reg.STATUS)
            if status & (Status.DONE | Status.ERROR) and not status & Status.BUSY:
                break
            if time.monotonic() > deadline:
                pc = link.read_reg(Reg.PC)
                raise LinkError(f"the program did not end within {PROGRAM_SECONDS:g} s: "
                                f"STATUS {status:#x}, PC {pc}")
        error_pc = link.read_reg(Reg.ERROR_PC)
        pc = link.read_reg(Reg.PC)
        cycles = link.read_reg(Reg.CYCLES_LO) | link.read_reg(Reg.CYCLES_HI) << 32
        perf = {name: link.read_reg(reg) for name, reg in PERF_COUNTERS.items()}
        perf["cycles"] = cycles
        done = bool(status & Status.DONE)
        dram = image.copy()
        for start, stop in stored_regions(image, prog_addr, prog_len):
            dram[start:stop] = np.frombuffer(link.read_bytes(DRAM_BASE + start, stop - start),
                                             dtype=np.uint8)
        stats = None if before is None else LinkStats(
            link.stats.tx_bytes - before.tx_bytes, link.stats.rx_bytes - before.rx_bytes,
            link.stats.seconds - before.seconds).as_dict()
        return RunResult(done=done, error_code=ErrorCode((status >> Status.CODE_SHIFT) & 0xFF),
                         error_pc=0 if done else error_pc, cycles=cycles,
                         instructions=pc + 1 if done else error_pc, dram=dram, perf=perf,
                         link=stats)


def load_description(path, config=None):
    """The SoC description (``soc.json``) a build wrote beside its bitstream: the address map
    and how to initialise the SDRAM; checked against ``config`` when given."""
    try:
        description = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise NPUValueError(f"cannot read the SoC description {path}: {error}") from None
    if config is not None and NPUConfig.from_json(description["config"]) != config:
        raise NPUValueError(f"{path} describes a SoC with the NPU "
                            f"{NPUConfig.from_json(description['config']).key()}, not the "
                            f"{config.key()} asked for")
    if (description["npu_base"], description["dram_base"]) != (NPU_BASE, DRAM_BASE):
        raise NPUValueError(f"{path} has another address map than this software's "
                            f"(soc.memory_map): rebuild the bitstream")
    return description


def find_description(config):
    """The ``soc.json`` of a board build of ``config`` under ``build/board`` (the only one),
    for when ``--soc`` does not name one."""
    root = Path(os.environ.get("NPU_BUILD_DIR", Path(__file__).resolve().parent.parent /
                                "build")) / "board"
    found = []
    for path in sorted(root.glob("*/soc.json")):
        try:
            if NPUConfig.from_json(json.loads(path.read_text())["config"]) == config:
                found.append(path)
        except (OSError, ValueError, KeyError):
            continue
    if len(found) != 1:
        where = "none" if not found else ", ".join(map(str, found))
        raise NPUValueError(f"name the SoC's description with --soc (the soc.json written "
                            f"beside its bitstream); for {config.key()} under {root}: {where}")
    return found[0]


def _run_all(url, config, programs, description):
    with BoardLink(url) as link:
        board = BoardNPU(link)
        board.check(config)
        board.init_sdram(description)
        return [board.run(dram, prog_addr, prog_len) for dram, prog_addr, prog_len in programs]


def run_on_board(config, programs):
    """Run ``(dram, prog_addr, prog_len)`` programs on the board that :data:`BOARD_ENV`
    names (the CLI's ``--port``), described by :data:`SOC_ENV` (the CLI's ``--soc``) or the
    one board build of ``config`` (:func:`find_description`)."""
    url = os.environ.get(BOARD_ENV)
    if not url:
        raise NPUValueError(f"sim 'board' needs the board's port: --port /dev/ttyUSB0 (or "
                            f"socket://HOST:PORT, tcp://HOST:PORT), or {BOARD_ENV}=...")
    path = os.environ.get(SOC_ENV) or find_description(config)
    return _run_all(url, config, programs, load_description(path, config))


def run_on_simulated_soc(config, programs):
    """Run the programs on the simulated SoC (:class:`soc.simulation.SimulatedSoC`), started
    for them and stopped after."""
    from soc.simulation import SimulatedSoC
    with SimulatedSoC(config) as soc:
        return _run_all(soc.url, config, programs, load_description(soc.description, config))
