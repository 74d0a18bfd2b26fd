"""``python -m fpga``: the ECP5 flow (``run``), the multi-config report (``report``) and the
ULX3S bitstream (``board``). The Makefile's ``fpga``, ``fpga-report`` and ``fpga-board``
targets call these."""

import argparse
import json
import sys

from hw.config import NPUConfig
from .board import CLOCK_MHZ, SEED, TMG_RIPUP, build_board
from .flow import DEVICES, MAC_STYLES, ROUTERS, TOPS, FlowError, FlowOptions, run
from .report import ARRAY_CONFIGS, JOBS, NPU_CONFIGS, SEEDS, write_report


def _config(name):
    try:
        return NPUConfig.from_name(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _flow_arguments(parser):
    parser.add_argument("--device", choices=sorted(DEVICES), default="LFE5U-85F")
    parser.add_argument("--freq", type=float, default=FlowOptions.frequency_mhz, metavar="MHZ",
                        help="clock constraint given to nextpnr (default "
                        f"{FlowOptions.frequency_mhz:g})")
    parser.add_argument("--mac", choices=MAC_STYLES, default="dsp",
                        help="dsp: pipelined PEs on MULT18X18D (default); plain: the Verilog "
                             "of 'npu verilog', multipliers as Yosys infers them")
    parser.add_argument("--router", choices=ROUTERS, default=FlowOptions.router,
                        help=f"nextpnr's router (default {FlowOptions.router})")
    parser.add_argument("--no-tmg-ripup", dest="tmg_ripup", action="store_false",
                        help="route without nextpnr's --tmg-ripup (the arcs that miss the "
                             "clock constraint ripped up and routed again)")
    parser.add_argument("--timing-weight", type=int, default=FlowOptions.placer_timing_weight,
                        metavar="W", help="nextpnr's --placer-heap-timingweight (default "
                        f"{FlowOptions.placer_timing_weight})")
    parser.add_argument("--pnr-minutes", type=_minutes, default=FlowOptions.pnr_minutes,
                        metavar="MIN", help="stop a place and route still running after this "
                        f"long, as a failed run (default {FlowOptions.pnr_minutes:g}; 0: no "
                        "limit)")


def _minutes(text):
    try:
        minutes = float(text)
    except ValueError:
        minutes = -1
    if minutes < 0:
        raise argparse.ArgumentTypeError(f"minutes must be a number, at least 0, not {text!r}")
    return minutes or None


def _names(text):
    return [name.strip() for name in text.split(",") if name.strip()]


def _configs(text):
    return [_config(name) for name in _names(text)]


def _seeds(text):
    try:
        return tuple(int(seed) for seed in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be comma-separated integers, not "
                                         f"{text!r}") from None


def _jobs(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"jobs must be a positive integer, not {text!r}")
    return int(text)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fpga", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    one = commands.add_parser("run", help="synthesize, place and route one config")
    one.add_argument("--config", type=_config, default=NPUConfig.from_name("8x8"))
    _flow_arguments(one)
    one.add_argument("--seed", type=int, default=FlowOptions.seed,
                     help=f"nextpnr placement seed (default {FlowOptions.seed})")
    one.add_argument("--top", choices=TOPS, default="npu",
                     help="npu: the whole NPU (default); array, controller: that block alone")
    one.add_argument("--synth-only", action="store_true", help="stop after Yosys")
    one.add_argument("--json", action="store_true", help="print report.json")

    many = commands.add_parser("report", help="run several configs and write docs/fpga.md")
    many.add_argument("--configs", type=_configs, default=",".join(NPU_CONFIGS),
                      help="comma-separated configs of the whole NPU (default "
                           f"{','.join(NPU_CONFIGS)})")
    many.add_argument("--array-configs", type=_configs, default=",".join(ARRAY_CONFIGS),
                      help="comma-separated configs of the array alone (default "
                           f"{','.join(ARRAY_CONFIGS)})")
    _flow_arguments(many)
    many.add_argument("--seeds", type=_seeds, default=SEEDS,
                      help="comma-separated nextpnr seeds: each for the whole NPU, the first "
                           f"for the array alone (default {','.join(map(str, SEEDS))})")
    many.add_argument("--jobs", type=_jobs, default=JOBS,
                      help=f"runs at a time, in worker processes (default {JOBS})")
    many.add_argument("--out", default="docs/fpga.md", metavar="FILE")
    many.add_argument("--reuse", action="store_true",
                      help="reuse a run's report.json when it was made with the same "
                           "options and seed (for editing the page)")

    board = commands.add_parser("board", help="bitstream for a real board (amaranth-boards)")
    board.add_argument("--config", type=_config, default=NPUConfig.from_name("8x8"))
    board.add_argument("--board", default="ulx3s-85f", help="ulx3s-25f, -45f or -85f")
    board.add_argument("--clock-mhz", type=float, default=CLOCK_MHZ, metavar="MHZ",
                       help="the NPU clock: the PLL makes the largest frequency it can at or "
                            f"below this (default {CLOCK_MHZ:g})")
    board.add_argument("--seed", type=int, default=SEED,
                       help=f"nextpnr's placement seed (default {SEED})")
    board.add_argument("--tmg-ripup", action=argparse.BooleanOptionalAction, default=TMG_RIPUP,
                       help="route again the paths that miss the clock, up to 50 rounds "
                            f"(default {'on' if TMG_RIPUP else 'off'})")

    arguments = parser.parse_args(argv)
    try:
        if arguments.command == "run":
            options = FlowOptions(device=arguments.device, frequency_mhz=arguments.freq,
                                  mac=arguments.mac, seed=arguments.seed, top=arguments.top,
                                  placer_timing_weight=arguments.timing_weight,
                                  router=arguments.router, tmg_ripup=arguments.tmg_ripup,
                                  synth_only=arguments.synth_only,
                                  pnr_minutes=arguments.pnr_minutes)
            report = run(arguments.config, options,
                         log=(lambda line: print(line, file=sys.stderr)) if arguments.json
                         else print)
            if arguments.json:
                print(json.dumps(report, indent=2))
        elif arguments.command == "report":
            options = FlowOptions(device=arguments.device, frequency_mhz=arguments.freq,
                                  mac=arguments.mac, pnr_minutes=arguments.pnr_minutes,
                                  placer_timing_weight=arguments.timing_weight,
                                  router=arguments.router, tmg_ripup=arguments.tmg_ripup)
            write_report(arguments.configs, arguments.array_configs, options, arguments.out,
                         seeds=arguments.seeds, jobs=arguments.jobs, reuse=arguments.reuse)
        else:
            build_board(arguments.config, arguments.board, clock_mhz=arguments.clock_mhz,
                        seed=arguments.seed, tmg_ripup=arguments.tmg_ripup)
    except (FlowError, ValueError) as error:
        print(f"fpga: error: {error}", file=sys.stderr)
        return 1
    return 0


# The guard keeps the report's worker processes from running the command again, should
# they ever import this module (they would under the "spawn" start method).
if __name__ == "__main__":
    sys.exit(main())
