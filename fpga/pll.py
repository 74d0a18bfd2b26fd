"""The ECP5 PLL (``EHXPLLL``) settings for a clock frequency, as Project Trellis' ``ecppll``
computes them.

``ecppll`` (``libtrellis/tools/ecppll.cpp`` in YosysHQ/prjtrellis; the YoWASP wheel has it as
``yowasp-ecppll``) tries every reference divisor ``CLKI_DIV`` (1 to 128), feedback divisor
``CLKFB_DIV`` (1 to 80) and output divisor ``CLKOP_DIV`` (1 to 128) with the feedback from
``CLKOP``, so that::

    f_pfd = f_in / CLKI_DIV            (3.125 to 400 MHz)
    f_vco = f_pfd * CLKFB_DIV * CLKOP_DIV   (400 to 800 MHz)
    f_out = f_vco / CLKOP_DIV = f_pfd * CLKFB_DIV

and keeps the output nearest the target; between equally near ones, the VCO nearest
600 MHz; between those, the first tried. ``CLKOP_CPHASE`` shifts ``CLKOP`` by half a period,
as Lattice's tools do: ``CLKOP_DIV / 2`` VCO cycles, truncated after ecppll's mix of single
and double precision (so 9, not 10, for ``CLKOP_DIV`` 20); ``CLKOP_FPHASE`` is 0.
:func:`ecp5_pll` does the same search in the same arithmetic, so that it picks what
``ecppll`` picks, ties and phases included.
"""

from dataclasses import dataclass

import numpy as np


__all__ = ["PLLSetting", "ecp5_pll"]


# ecppll's limits (its #defines), in MHz: the EHXPLLL's input, output, phase detector and
# VCO ranges.
INPUT_RANGE = (8.0, 400.0)
OUTPUT_RANGE = (10.0, 400.0)
PFD_RANGE = (3.125, 400.0)
VCO_RANGE = (400.0, 800.0)
#: Between equally good settings, ecppll keeps the VCO nearest this (MHz).
VCO_PREFERRED = 600.0
# The divisors' ranges, as ecppll searches them.
CLKI_DIVS = range(1, 129)
CLKFB_DIVS = range(1, 81)
CLKOP_DIVS = range(1, 129)


@dataclass(frozen=True)
class PLLSetting:
    """One ``EHXPLLL`` setting, feedback from ``CLKOP``.

    Attributes
    ----------
    input_mhz : float
        The reference clock (``CLKI``).
    clki_div, clkfb_div, clkop_div : int
        The reference, feedback and ``CLKOP`` divisors.
    clkop_cphase, clkop_fphase : int
        ``CLKOP``'s coarse (VCO cycles) and fine (eighths of one) phase shift.
    vco_mhz : float
        The VCO frequency.
    output_mhz : float
        What ``CLKOP`` makes: ``input_mhz / clki_div * clkfb_div``, as ecppll computes it
        in single precision (so 33.33333206176758 for 25 / 3 * 4).
    """
    input_mhz: float
    clki_div: int
    clkfb_div: int
    clkop_div: int
    clkop_cphase: int
    clkop_fphase: int
    vco_mhz: float
    output_mhz: float


def _check_range(name, value, limits, what):
    low, high = limits
    if not low <= value <= high:
        raise ValueError(f"{name} must be {low:g} to {high:g} MHz ({what}), not {value!r}")


def _candidates(input_mhz):
    """Every setting ecppll tries, in its loop order (reference, feedback, output divisor),
    in single precision: (CLKI_DIV, CLKFB_DIV, CLKOP_DIV, f_vco, f_out, valid)."""
    clki = np.arange(CLKI_DIVS.start, CLKI_DIVS.stop, dtype=np.float32)[:, None, None]
    clkfb = np.arange(CLKFB_DIVS.start, CLKFB_DIVS.stop, dtype=np.float32)[None, :, None]
    clkop = np.arange(CLKOP_DIVS.start, CLKOP_DIVS.stop, dtype=np.float32)[None, None, :]
    pfd = np.float32(input_mhz) / clki
    vco = pfd * clkfb * clkop               # (pfd * clkfb) * clkop, as C evaluates it
    out = vco / clkop
    valid = ((pfd >= PFD_RANGE[0]) & (pfd <= PFD_RANGE[1])
             & (vco >= VCO_RANGE[0]) & (vco <= VCO_RANGE[1]))
    shape = valid.shape
    return (np.broadcast_to(clki, shape), np.broadcast_to(clkfb, shape),
            np.broadcast_to(clkop, shape), vco, out, valid)


def ecp5_pll(input_mhz, output_mhz, *, at_most=False):
    """The ``EHXPLLL`` setting that ``ecppll -i input_mhz -o output_mhz`` writes.

    With ``at_most``, the output is the largest one the PLL can make at or below
    ``output_mhz`` instead of the nearest (and the setting is what ``ecppll`` writes for
    that frequency). Unlike ``ecppll``, which only warns, an input or target outside the
    EHXPLLL's ranges (8 to 400 MHz in, 10 to 400 MHz out) is a ``ValueError``, as is an
    ``at_most`` target below every output the PLL makes within its range.

    Returns
    -------
    :class:`PLLSetting`
    """
    _check_range("input_mhz", input_mhz, INPUT_RANGE, "EHXPLLL input")
    _check_range("output_mhz", output_mhz, OUTPUT_RANGE, "EHXPLLL output")
    clki, clkfb, clkop, vco, out, valid = _candidates(input_mhz)
    target = np.float32(output_mhz)
    if at_most:
        below = valid & (out <= target) & (out >= OUTPUT_RANGE[0])
        if not below.any():
            raise ValueError(f"no EHXPLLL output from {input_mhz!r} MHz lies between "
                             f"{OUTPUT_RANGE[0]:g} and output_mhz, {output_mhz!r} MHz")
        target = out[below].max()
    # ecppll keeps the first setting of least error, then of VCO nearest 600 MHz:
    # argmin returns the first of equal minima, in the loops' order.
    error = np.where(valid, np.abs(out - target), np.inf)
    nearest = error == error.min()
    off_preferred = np.where(nearest, np.abs(vco - np.float32(VCO_PREFERRED)), np.inf)
    index = np.unravel_index(np.argmin(off_preferred), off_preferred.shape)
    fout, fvco = out[index], vco[index]
    # Half a period of the output in VCO cycles, with ecppll's float and double steps:
    # ns_phase = 1 / (fout * 1e6) * 0.5 (stored as a float), times fvco * 1e6, truncated.
    ns_phase = np.float32(1 / (float(fout) * 1e6) * 0.5)
    cphase = int(float(ns_phase) * (float(fvco) * 1e6))
    return PLLSetting(input_mhz=float(np.float32(input_mhz)), clki_div=int(clki[index]),
                      clkfb_div=int(clkfb[index]), clkop_div=int(clkop[index]),
                      clkop_cphase=cphase, clkop_fphase=0, vco_mhz=float(fvco),
                      output_mhz=float(fout))
