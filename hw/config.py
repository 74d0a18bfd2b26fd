"""The one configuration object shared by the gateware (``hw``) and the software (``sw``).

Everything that both sides must agree on (array size, memory depths, bus width) lives here,
so that the compiler can never target a different machine from the one that was built.
"""

import json
import re
from dataclasses import dataclass, field, fields


__all__ = ["NPUConfig", "MAX_K", "BUS_WIDTHS", "default_bus_width", "FETCH_BURST",
           "FETCH_DEPTH", "FETCH_HIGH_WATER", "FETCH_LOW_WATER"]


#: Largest reduction length for which an INT32 sum of INT8 x INT8 products cannot overflow:
#: 131071 * (-128 * -128) = 2_147_467_264 <= 2**31 - 1, while 131072 * 16384 = 2**31.
MAX_K = 131_071

# The instruction fetcher (hw/controller/fetcher.py); the cycle model (sw/timing.py) follows it.
#: Instructions fetched by one DMA read command.
FETCH_BURST = 8
#: Depth of the instruction queue (in the decoder, between the fetcher and the issue stage).
FETCH_DEPTH = 16
#: The fetcher asks for another batch only while it holds at most this many words (in the
#: decoder's stages and queue), so that a whole batch still fits in the queue.
FETCH_HIGH_WATER = FETCH_DEPTH - FETCH_BURST
#: Below this many words held, the fetcher goes before the load unit on the reader.
FETCH_LOW_WATER = 4

#: The AXI4 data widths the NPU can be built with, in bits.
BUS_WIDTHS = (32, 64, 128, 256, 512)
#: The narrowest bus a config gets by default: what every array up to 8 rows had before the
#: default followed the array (a 32-bit bus stays available, given explicitly).
_NARROWEST_DEFAULT_BUS = 64


def default_bus_width(rows):
    """The bus width of an array of ``rows`` PE rows when none is given: one INT8 activation
    row (``8 * rows`` bits) a beat, so the DMA can feed the array a row a cycle (Kung's
    balance of computation against I/O), rounded up to a power of two; at least 64 and at most
    the widest in :data:`BUS_WIDTHS` (512, which 64 rows fill)."""
    width = _NARROWEST_DEFAULT_BUS
    while width < 8 * rows and width < BUS_WIDTHS[-1]:
        width *= 2
    return width


_CONFIG_NAME = re.compile(r"^([1-9][0-9]*)x([1-9][0-9]*)$")


@dataclass(frozen=True)
class NPUConfig:
    """Parameters of one NPU instance.

    Parameters
    ----------
    rows : int
        R, the number of PE rows: the reduction (K) extent of one weight tile.
    cols : int
        C, the number of PE columns: the output (N) extent of one weight tile.
    spad_depth : int
        Number of scratchpad rows. A scratchpad row holds ``spad_row_bytes`` INT8 values.
    acc_depth : int
        Number of accumulator rows. An accumulator row holds ``cols`` INT32 values.
    bus_width : int, optional
        Data width of the AXI4 master in bits, one of :data:`BUS_WIDTHS` (32 to 512). Left
        out (or ``None``), :func:`default_bus_width` of ``rows``: 64 up to 8 rows, 128 up to
        16, 256 up to 32, 512 above; the config then holds that number, so its JSON form and
        :meth:`key` name it.
    addr_width : int
        Width of DRAM byte addresses on the AXI4 master.
    """
    rows: int = 8
    cols: int = 8
    spad_depth: int = 2048
    acc_depth: int = 512
    bus_width: int = None
    addr_width: int = field(default=32)

    def __post_init__(self):
        if self.bus_width is None and isinstance(self.rows, int):
            # A frozen dataclass: the default that depends on another field is set here.
            object.__setattr__(self, "bus_width", default_bus_width(self.rows))
        for item in fields(self):
            value = getattr(self, item.name)
            # 64.0 would pass the checks below and then break every width computed from it.
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{item.name} must be an integer, not {value!r}")
        for name in ("rows", "cols", "spad_depth", "acc_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if self.rows > 256 or self.cols > 256:
            raise ValueError(f"rows and cols must be at most 256, not {self.rows}x{self.cols}")
        for name in ("spad_depth", "acc_depth"):
            value = getattr(self, name)
            if value > 65536:
                raise ValueError(f"{name} must be at most 65536 (16-bit instruction field), "
                                 f"not {value}")
        if self.spad_depth < self.rows:
            raise ValueError(f"spad_depth must hold at least one weight tile of {self.rows} "
                             f"rows, not {self.spad_depth}")
        if self.bus_width not in BUS_WIDTHS:
            raise ValueError(f"bus_width must be one of {', '.join(map(str, BUS_WIDTHS))}, "
                             f"not {self.bus_width!r}")
        if self.addr_width != 32:
            raise ValueError(f"addr_width must be 32, not {self.addr_width!r}")

    @classmethod
    def from_name(cls, name, **kwargs):
        """Parse a config name of the form ``RxC`` (for example ``8x8`` or ``3x5``)."""
        match = _CONFIG_NAME.match(str(name).strip())
        if match is None:
            raise ValueError(f"config must be written RxC with positive integers, "
                             f"for example 8x8 or 3x5, not {name!r}")
        return cls(rows=int(match.group(1)), cols=int(match.group(2)), **kwargs)

    def to_json(self):
        """Every field of this config as one JSON object (a ``str``), for
        :meth:`from_json`: how a config travels to a simulator process."""
        return json.dumps({item.name: getattr(self, item.name) for item in fields(self)})

    @classmethod
    def from_json(cls, text):
        """The config that :meth:`to_json` wrote.

        A field left out takes its default, as in the constructor. Raises ``ValueError`` for
        text that is not a JSON object, an unknown field, or a value the constructor refuses.
        """
        if not isinstance(text, str):
            raise ValueError(f"an NPUConfig must be given as a JSON object in a str, not "
                             f"{text!r}")
        try:
            values = json.loads(text)
        except ValueError as error:
            raise ValueError(f"an NPUConfig must be given as a JSON object, but {text!r} is "
                             f"not JSON ({error})") from None
        if not isinstance(values, dict):
            raise ValueError(f"an NPUConfig must be given as a JSON object, not {text!r}")
        known = [item.name for item in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown NPUConfig fields {', '.join(unknown)} in {text!r}; the "
                             f"fields are {', '.join(known)}")
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f"{error} (in the NPUConfig {text!r})") from None

    @property
    def name(self):
        return f"{self.rows}x{self.cols}"

    @property
    def spad_row_bytes(self):
        """Bytes in a scratchpad row: an activation row (R values) or a weight row (C values)."""
        return max(self.rows, self.cols)

    @property
    def acc_row_bytes(self):
        """Bytes in an accumulator row: C INT32 lanes."""
        return 4 * self.cols

    @property
    def bus_bytes(self):
        return self.bus_width // 8

    @property
    def dma_row_bytes(self):
        """Widest row the DMA moves: a scratchpad row or an accumulator row."""
        return max(self.spad_row_bytes, self.acc_row_bytes)

    @property
    def dram_bytes(self):
        return 1 << self.addr_width

    def key(self):
        """A string that names this build uniquely (used for build caches)."""
        return (f"{self.rows}x{self.cols}_s{self.spad_depth}_a{self.acc_depth}"
                f"_b{self.bus_width}")
