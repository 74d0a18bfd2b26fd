"""``make fpga-report``: the ECP5 flow for several configs, written up as ``docs/fpga.md``."""

import json
import platform as host_platform
import time
from pathlib import Path

from .flow import DEVICES, PACKAGE, SPEED, FlowOptions, build_dir, run


__all__ = ["write_report", "render"]


def _same_options(report, options):
    return (report.get("device") == options.device and report.get("mac") == options.mac
            and report.get("target_mhz") == options.frequency_mhz
            and report.get("seed") == options.seed and "fmax_mhz" in report)


def write_report(configs, options=None, out="docs/fpga.md", *, reuse=False, log=print):
    """Run the flow for every config (or reuse a matching ``report.json``) and write ``out``."""
    if options is None:
        options = FlowOptions()
    reports = []
    for config in configs:
        existing = build_dir(config, options.device, options.mac) / "report.json"
        if reuse and existing.exists():
            report = json.loads(existing.read_text())
            if _same_options(report, options):
                log(f"fpga: reusing {existing}")
                reports.append(report)
                continue
        reports.append(run(config, options, log=log))
    extra = []
    for path in sorted((build_dir.__globals__["REPO_ROOT"] / "build" / "fpga").glob(
            "*/report.json")):
        report = json.loads(path.read_text())
        if "fmax_mhz" in report and not any(
                (report["config"], report["device"], report["mac"]) ==
                (r["config"], r["device"], r["mac"]) for r in reports):
            extra.append(report)
    text = render(reports, extra)
    Path(out).write_text(text)
    log(f"fpga: wrote {out}")
    return reports


def _row(report):
    critical = report.get("critical_path") or {}
    return (f"| {report['config']} | {report['device']} | {report['mac']} | "
            f"{report['lut4']} | {report['ff']} | {report['mult18x18d']} | "
            f"{report['dp16kd']} | {report['fmax_mhz']:.1f} | {report['peak_gops']:.1f} | "
            f"{_path_summary(critical)} | {report['seconds'] / 60:.0f} |")


def _path_summary(critical):
    if not critical:
        return "-"
    return (f"{critical['delay_ns']:.2f} ns ({critical['logic_ns']:.2f} logic): "
            f"`{_short(critical['from'])}` -> `{_short(critical['to'])}`")


def _short(cell):
    return cell if len(cell) <= 48 else "..." + cell[-45:]


_TABLE_HEAD = ("| config | device | MAC | LUT4 | FF | MULT18X18D | DP16KD | Fmax (MHz) | "
               "peak GOPS | critical path | minutes |\n"
               "|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|\n")


def render(reports, extra=()):
    """The Markdown page: how it was measured, the table, and what each figure means."""
    when = time.strftime("%Y-%m-%d")
    first = reports[0]
    lines = [
        "# The NPU on Lattice ECP5",
        "",
        f"Measured by `make fpga-report` on {when} ({host_platform.machine()}, "
        f"{first['router']}, nextpnr seed {first['seed']}, clock constraint "
        f"{first['target_mhz']:.0f} MHz). Every figure is nextpnr's post-route estimate for "
        f"the whole NPU (array, scratchpad, accumulator, requantizer, DMA, controller, host "
        f"registers) on `{first['device']}` in `{PACKAGE}`, speed grade {SPEED}.",
        "",
        _TABLE_HEAD.rstrip("\n"),
        *(_row(report) for report in reports),
        "",
        "Peak throughput is 2 x R x C x Fmax operations per second (one multiply and one add "
        "per PE per cycle).",
    ]
    if extra:
        lines += ["", "Other runs found in `build/fpga/` (same flow, other options):", "",
                  _TABLE_HEAD.rstrip("\n"), *(_row(report) for report in extra)]
    lines += ["", "Resources as nextpnr placed them: LUT4 is `TRELLIS_COMB` (LUT4s, including "
              "those in carry chains and distributed RAM), FF is `TRELLIS_FF`. Yosys' own "
              "counts are in each `report.json` under `yosys_cells`.", ""]
    return "\n".join(lines) + "\n"
