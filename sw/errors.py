"""The exceptions of the NPU software stack.

Everything the compiler, model, backend and driver raise on purpose derives from
:class:`NPUError`, so a caller (the CLI, for one) can catch the project's own errors without
also swallowing genuine bugs. Each class is also a subclass of the matching built-in
(``TypeError``, ``ValueError``, ``RuntimeError``), so ``except ValueError`` keeps working.
"""

from types import MappingProxyType

from hw.isa import ErrorCode


__all__ = [
    "NPUError", "NPUTypeError", "NPUValueError", "PlanError", "NPURunError",
    "BackendUnavailable", "LinkError", "ERROR_TEXT", "first_line",
]


#: What each :class:`hw.isa.ErrorCode` means, for messages (docs/architecture.md's table).
ERROR_TEXT = MappingProxyType({
    ErrorCode.NONE:           "no error",
    ErrorCode.ILLEGAL_OPCODE: "an illegal opcode",
    ErrorCode.SPAD_RANGE:     "a scratchpad row out of range",
    ErrorCode.ACC_RANGE:      "an accumulator row out of range",
    ErrorCode.BAD_LENGTH:     "zero rows or bytes, or more bytes than a row holds",
    ErrorCode.BUS_READ:       "a read answered SLVERR or DECERR",
    ErrorCode.BUS_WRITE:      "a write answered SLVERR or DECERR",
    ErrorCode.PROGRAM:        "a bad program address or length, or no END within it",
    ErrorCode.DRAM_RANGE:     "a DRAM block past the top of the address space",
    ErrorCode.QUANT:          "bad requantization parameters",
    ErrorCode.START_BUSY:     "a start while a program ran",
    ErrorCode.BUS_TIMEOUT:    "the bus did not answer within the watchdog's limit; soft-reset "
                              "the NPU (CONTROL bit 1) before the next start",
})


class NPUError(Exception):
    """Base class of every error the NPU software raises on purpose."""


class NPUTypeError(NPUError, TypeError):
    """An argument has the wrong type (for example a float matrix where INT8 is required)."""


class NPUValueError(NPUError, ValueError):
    """An argument has the right type but a value the NPU cannot take."""


class PlanError(NPUValueError):
    """The compiler cannot place a GEMM on the given configuration."""


class NPURunError(NPUError, RuntimeError):
    """A program stopped with an error instead of reaching ``END``.

    Parameters
    ----------
    error_code : hw.isa.ErrorCode
        Why the program stopped.
    error_pc : int
        Index of the instruction that failed.
    message : str, optional
        Text to use instead of the default one.

    Attributes
    ----------
    error_code : hw.isa.ErrorCode
    error_pc : int
    """

    def __init__(self, error_code, error_pc, message=None):
        self.error_code = error_code
        self.error_pc = error_pc
        if message is None:
            message = (f"the NPU program stopped with error {error_code.name} "
                       f"at instruction {error_pc}: {ERROR_TEXT[error_code]}")
        super().__init__(message)


class BackendUnavailable(NPUError, RuntimeError):
    """A simulator backend (or another optional part such as ``hw.top``) is not installed."""


class LinkError(NPUError, RuntimeError):
    """The link to a board (or to the simulated SoC) failed: nothing answers, what answers is
    not the NPU, or a byte was corrupted on the way (:mod:`sw.board`)."""


def first_line(error):
    """The first line of an exception's message (its type's name when it has none): what a
    one-line error quotes of a library's multi-line one."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
