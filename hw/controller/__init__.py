"""The controller: fetches the program ahead, issues it in order to four units that overlap.

Block diagram (see docs/architecture.md, "Controller")::

    DMA reader --> fetcher --> instruction queue --> decoder --> issue stage (hazards, errors)
                     ^                                              |
                     |          +------------------+----------------+------------------+
                     |          v                  v                v                  v
                     +---- load unit        weight loader        streamer          store unit
                        LOAD_SPAD/ACC/QUANT    PRELOAD             MATMUL          STORE, STORE_Q
                        -> scratchpad,      spad weight port   spad act port    acc read port,
                           acc (via the     -> shadow weights  -> array -> acc  requantizer
                           streamer)                                            -> DMA writer

One block per file; :mod:`.signatures` holds the layouts and signatures they share.
"""

from .controller import Controller
from .signatures import HostLinkSignature, PerfCounters


__all__ = ["Controller", "HostLinkSignature", "PerfCounters"]
