"""The DMA engine (:class:`DMA`): its reader (:class:`DMAReader`) and writer
(:class:`DMAWriter`) on one AXI4 master, and the block command and burst geometry they share
(:mod:`.bursts`)."""

from .bursts import MAX_READS_OUTSTANDING, BlockCommand, ReadCommand, row_beats
from .dma import DMA
from .reader import DMAReader
from .writer import DMAWriter


__all__ = ["BlockCommand", "ReadCommand", "DMA", "DMAReader", "DMAWriter",
           "MAX_READS_OUTSTANDING", "row_beats"]
