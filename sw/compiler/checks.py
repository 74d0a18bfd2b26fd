"""The checks the compiler makes of its arguments: each returns the checked value or raises an
error that names the argument and shows the bad value."""

import operator

import numpy as np

from hw.config import NPUConfig
from hw.isa import QuantMode
from ..errors import NPUTypeError, NPUValueError, PlanError


__all__ = ["ADDRESS_SPACE", "as_int", "check_positive", "check_config", "check_region",
           "check_padding", "check_quant_operands", "check_quant_mode"]


#: Bytes a 32-bit DRAM address reaches.
ADDRESS_SPACE = 1 << 32


def as_int(name, value):
    """``value`` as a Python int; numpy integers (shapes, sizes) are fine, bools and floats
    are mistakes."""
    if isinstance(value, (bool, np.bool_)):
        raise NPUTypeError(f"{name} must be an integer, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise NPUTypeError(f"{name} must be an integer, not {value!r}") from None


def check_positive(name, value):
    """``value`` as a Python int of at least 1."""
    value = as_int(name, value)
    if value < 1:
        raise NPUValueError(f"{name} must be a positive integer, not {value}")
    return value


def check_config(config):
    """Refuse anything but an :class:`~hw.config.NPUConfig`."""
    if not isinstance(config, NPUConfig):
        raise NPUTypeError(f"config must be an NPUConfig, not {config!r}")
    return config


def check_region(name, addr, size):
    """The address ``addr`` of a region of ``size`` bytes, which must lie in the 32-bit DRAM
    address space."""
    addr = as_int(name, addr)
    if addr < 0 or addr + size > ADDRESS_SPACE:
        raise PlanError(f"{name} = {addr:#x}: a region of {size} bytes there does not fit in "
                        f"the 32-bit DRAM address space")
    return addr


def check_padding(name, value):
    """An int or a ``(top, bottom, left, right)`` sequence, as a tuple of four ints >= 0."""
    if isinstance(value, (tuple, list)):
        if len(value) != 4:
            raise NPUValueError(f"{name} must be an integer or (top, bottom, left, right), "
                                f"not {value!r}")
        sides = tuple(as_int(name, side) for side in value)
    else:
        sides = (as_int(name, value),) * 4
    if min(sides) < 0:
        raise NPUValueError(f"{name} must not be negative, not {value!r}")
    return sides


def check_quant_operands(zero_point, act_min, act_max):
    """The output zero point and clamp, each within -128 .. 127, ``act_min <= act_max``."""
    zero_point, act_min, act_max = (as_int(name, value) for name, value in (
        ("out_zero_point", zero_point), ("act_min", act_min), ("act_max", act_max)))
    for name, value in (("out_zero_point", zero_point), ("act_min", act_min),
                        ("act_max", act_max)):
        if not -128 <= value <= 127:
            raise NPUValueError(f"{name} must be within -128 .. 127, not {value}")
    if act_min > act_max:
        raise NPUValueError(f"act_min must not exceed act_max, but act_min = {act_min} and "
                            f"act_max = {act_max}")
    return zero_point, act_min, act_max


def check_quant_mode(quant_mode):
    """``quant_mode`` as a :class:`~hw.isa.QuantMode`."""
    try:
        return QuantMode(quant_mode)
    except ValueError:
        raise NPUValueError(f"quant_mode must be one of {[mode.name for mode in QuantMode]}, "
                            f"not {quant_mode!r}") from None
