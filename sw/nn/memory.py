"""DRAM buffer planning for intermediate activations: greedy interval coloring with reuse.

Each tensor lives from the step that writes it to the last step that reads it (both
inclusive). A tensor whose buffer holds data the host wrote before the program started (the
network input, or the zero-point border of a padded buffer that a layer writes only the
interior of) lives from step 0. Two tensors may share bytes only when their lifetimes do not
overlap: a buffer is free again once its last consumer is done. A *pinned* tensor keeps its
bytes for good: a padded buffer whose border the host writes once, at set-up, must not be
overwritten by a later tensor, or the host would have to write the border again for every
batch.

Tensors are taken in order of their first step (larger first on a tie) and each goes to a
free buffer: the smallest one that fits, else the largest free one, grown to fit, else a new
buffer. Buffers are then laid out one after another, each aligned.
"""

from dataclasses import dataclass

from ..errors import NPUValueError


__all__ = ["TensorLife", "BufferPlan", "plan_buffers", "overlaps"]


@dataclass(frozen=True)
class TensorLife:
    """One tensor's size and lifetime.

    Attributes
    ----------
    name : str
    bytes : int
    first, last : int
        The steps that write it first and read it last (``first <= last``).
    pinned : bool
        No other tensor may use its bytes afterwards (it stays valid across runs).
    """
    name: str
    bytes: int
    first: int
    last: int
    pinned: bool = False

    def __post_init__(self):
        if not isinstance(self.bytes, int) or self.bytes < 1:
            raise NPUValueError(f"tensor {self.name}: bytes must be a positive integer, "
                                f"not {self.bytes!r}")
        if not 0 <= self.first <= self.last:
            raise NPUValueError(f"tensor {self.name}: need 0 <= first <= last, not "
                                f"first={self.first}, last={self.last}")


def overlaps(a, b):
    """Whether two tensors may not share bytes: their lifetimes share a step, or the earlier
    one is pinned."""
    if a.first > b.first:
        a, b = b, a
    return b.first <= a.last or a.pinned


def _align(value, alignment):
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class BufferPlan:
    """Where each tensor lives in the activation arena.

    Attributes
    ----------
    lives : tuple of TensorLife
    buffer_of : dict
        ``{tensor name: buffer index}``.
    buffer_sizes, buffer_offsets : tuple of int
        Each buffer's size (aligned) and byte offset in the arena.
    alignment : int
    """
    lives: tuple
    buffer_of: dict
    buffer_sizes: tuple
    buffer_offsets: tuple
    alignment: int

    def offset(self, name):
        """Byte offset of tensor ``name`` in the arena."""
        return self.buffer_offsets[self.buffer_of[name]]

    @property
    def total_bytes(self):
        """Size of the arena."""
        return sum(self.buffer_sizes)

    @property
    def naive_bytes(self):
        """The arena without reuse: one aligned buffer per tensor."""
        return sum(_align(life.bytes, self.alignment) for life in self.lives)

    @property
    def reused(self):
        """``{buffer index: [tensor names]}`` of the buffers that hold more than one tensor."""
        holders = {}
        for life in self.lives:
            holders.setdefault(self.buffer_of[life.name], []).append(life.name)
        return {index: names for index, names in holders.items() if len(names) > 1}

    def conflicts(self):
        """Pairs of tensors that are live at the same step and share a byte (should be
        empty)."""
        found = []
        for i, a in enumerate(self.lives):
            for b in self.lives[i + 1:]:
                a_start, b_start = self.offset(a.name), self.offset(b.name)
                share_bytes = a_start < b_start + b.bytes and b_start < a_start + a.bytes
                if overlaps(a, b) and share_bytes:
                    found.append((a.name, b.name))
        return found

    def summary(self):
        lines = []
        for index, (offset, size) in enumerate(zip(self.buffer_offsets, self.buffer_sizes)):
            names = [life.name for life in self.lives if self.buffer_of[life.name] == index]
            lines.append(f"buffer {index}: offset {offset:#x}, {size} bytes: "
                         f"{', '.join(names)}")
        lines.append(f"arena {self.total_bytes} bytes (without reuse {self.naive_bytes})")
        return "\n".join(lines)


def plan_buffers(lives, alignment=64):
    """Assign every tensor of ``lives`` to a buffer, reusing dead buffers.

    Parameters
    ----------
    lives : iterable of TensorLife
        Names must be unique.
    alignment : int
        Every buffer size and offset is a multiple of this.

    Returns
    -------
    BufferPlan
    """
    lives = tuple(lives)
    names = [life.name for life in lives]
    if len(set(names)) != len(names):
        raise NPUValueError(f"tensor names must be unique, not {names}")
    if not isinstance(alignment, int) or alignment < 1:
        raise NPUValueError(f"alignment must be a positive integer, not {alignment!r}")

    sizes = []          # per buffer: size in bytes (grows)
    free_after = []     # per buffer: last step of its latest occupant
    buffer_of = {}
    for life in sorted(lives, key=lambda life: (life.first, -life.bytes, life.name)):
        free = [index for index in range(len(sizes)) if free_after[index] < life.first]
        fitting = [index for index in free if sizes[index] >= life.bytes]
        if fitting:
            index = min(fitting, key=lambda index: (sizes[index], index))
        elif free:
            index = max(free, key=lambda index: (sizes[index], -index))
            sizes[index] = life.bytes
        else:
            index = len(sizes)
            sizes.append(life.bytes)
            free_after.append(-1)
        free_after[index] = float("inf") if life.pinned else life.last
        buffer_of[life.name] = index

    aligned = tuple(_align(size, alignment) for size in sizes)
    offsets, position = [], 0
    for size in aligned:
        offsets.append(position)
        position += size
    plan = BufferPlan(lives=lives, buffer_of=buffer_of, buffer_sizes=aligned,
                      buffer_offsets=tuple(offsets), alignment=alignment)
    if plan.conflicts():
        raise RuntimeError(f"buffer planner bug: live tensors share bytes: {plan.conflicts()}")
    return plan
