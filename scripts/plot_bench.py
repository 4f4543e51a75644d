#!/usr/bin/env python3
"""PNG plots of `pagellm bench serve` reports (and of `pagellm bench cost --json` output).

    scripts/plot_bench.py REPORT.json [REPORT.json ...] [--cost COST.json ...] --out-dir DIR

Writes into DIR:
  latency_cdf.png        CDFs of TTFT, TPOT and end-to-end latency, one line per run (rate) of
                         every report. Exact when the report holds per-request data
                         (`bench serve --save-requests`); otherwise the report's p50/p90/p99/max
                         are drawn as points of the CDF (dashed), which is all it knows.
  throughput_vs_rate.png request throughput (with the offered rate for reference), goodput, and
                         output / total tokens per second against the request rate.
  latency_vs_rate.png    TTFT and TPOT p50 / p90 / p99 against the request rate.
  cost.png               output tokens/s per $/hour and $ per million output tokens, one bar per
                         row of the --cost files (only with --cost).

Rates: `inf` (all requests at once) is drawn to the right of the highest finite rate. Reports
are JSON of schema pagellm.bench.serve/1 (docs/BENCHMARKS.md); a cost file is the JSON array that
`bench cost --json` prints as its last line (the whole stdout may be given). Needs numpy and
matplotlib (scripts/requirements-test.txt).
"""
import argparse
import json
import math
import os
import sys

import numpy as np

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

SCHEMA = "pagellm.bench.serve/1"
LATENCIES = [("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E latency")]
PERCENTILES = [("p50", 0.50), ("p90", 0.90), ("p99", 0.99), ("max", 1.0)]


class InputError(Exception):
    pass


def load_report(path):
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: cannot read a JSON report: {e}")
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        raise InputError(f"{path}: not a `bench serve` report (schema is not {SCHEMA})")
    runs = report.get("runs") or [report]  # older single-run reports carry only the top level
    for i, run in enumerate(runs):
        for key in ["request_rate", "request_throughput", "output_throughput"] + [k for k, _ in LATENCIES]:
            if key not in run:
                raise InputError(f"{path}: run {i} has no '{key}'")
    return report, runs


def load_cost(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: {e}")
    # The file is the JSON array itself, or `bench cost --json`'s whole stdout (Markdown table,
    # then the array on the last line).
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.strip()][:1]
    for c in candidates:
        try:
            rows = json.loads(c)
        except json.JSONDecodeError:
            continue
        if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
            for r in rows:
                for key in ("gpu", "output_tok_s_per_usd_hour", "usd_per_million_output_tokens"):
                    if key not in r:
                        raise InputError(f"{path}: a cost row has no '{key}'")
            return rows
    raise InputError(f"{path}: no JSON array of `bench cost --json` rows")


def rate_value(rate):
    return math.inf if rate == "inf" or rate == math.inf else float(rate)


def rate_label(rate):
    r = rate_value(rate)
    return "inf" if math.isinf(r) else f"{r:g}"


def wide(values, ratio):
    """Whether positive values span more than `ratio` (then a log axis reads better)."""
    v = [x for x in values if x > 0 and math.isfinite(x)]
    return len(v) > 1 and max(v) / min(v) > ratio


def x_positions(rates):
    """Finite rates where they are; inf one step past the highest finite rate."""
    finite = [r for r in rates if not math.isinf(r)]
    top = max(finite) if finite else 1.0
    inf_x = (top * (2.0 if wide(finite, 10) else 1.25)) if finite else 1.0
    return [inf_x if math.isinf(r) else r for r in rates], inf_x


def run_label(name, run, n_runs):
    return f"{name} @ {rate_label(run['request_rate'])} req/s" if n_runs > 1 else name


def request_values(run, key):
    """Per-request values of a latency in ms, or None when the run has no per-request data."""
    reqs = [q for q in run.get("requests", []) if q.get("ok")]
    if not reqs:
        return None
    if key == "ttft_ms":
        return [1e3 * q["ttft_s"] for q in reqs]
    if key == "e2el_ms":
        return [1e3 * q["latency_s"] for q in reqs]
    # TPOT as bench serve defines it: (latency - TTFT) / (output tokens - 1), for > 1 token.
    return [1e3 * (q["latency_s"] - q["ttft_s"]) / (q["output_tokens"] - 1) for q in reqs if q["output_tokens"] > 1]


def plot_latency_cdf(reports, out):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, title) in zip(axes, LATENCIES):
        drawn = []
        for name, _, runs in reports:
            for run in runs:
                label = run_label(name, run, len(runs))
                values = request_values(run, key)
                if values:
                    x = np.sort(np.asarray(values))
                    # The empirical CDF: 0 below the smallest value, i/n from the i-th on.
                    x = np.concatenate([x[:1], x])
                    y = np.arange(0, len(x)) / (len(x) - 1)
                    ax.step(x, y, where="post", label=label)
                    drawn.extend(x)
                else:
                    s = run[key]
                    if not s.get("n", 1):
                        continue  # no sample of this latency in the run
                    xs = [s[p] for p, _ in PERCENTILES]
                    ys = [q for _, q in PERCENTILES]
                    ax.plot(xs, ys, "o--", label=label + " (percentiles)")
                    drawn.extend(xs)
        if wide(drawn, 100):  # runs (or engines) orders of magnitude apart
            ax.set_xscale("log")
        ax.set_title(f"{title} CDF")
        ax.set_xlabel(f"{title} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def rate_axis(ax, all_rates):
    xs, inf_x = x_positions(all_rates)
    if wide([r for r in all_rates if not math.isinf(r)], 10):
        ax.set_xscale("log")
        ax.minorticks_off()
    ticks = sorted(set(xs))
    ax.set_xticks(ticks)
    ax.set_xticklabels(["inf" if t == inf_x and any(math.isinf(r) for r in all_rates) else f"{t:g}" for t in ticks])
    ax.set_xlabel("request rate (req/s)")
    ax.grid(True, alpha=0.3)


def series(runs, get, all_rates):
    """(x, y) of a per-run figure, in rate order, on the shared rate axis."""
    xs_all, inf_x = x_positions(all_rates)
    points = []
    for run in runs:
        r = rate_value(run["request_rate"])
        points.append((inf_x if math.isinf(r) else r, get(run)))
    points.sort()
    return [p[0] for p in points], [p[1] for p in points]


def plot_throughput(reports, out):
    all_rates = sorted({rate_value(r["request_rate"]) for _, _, runs in reports for r in runs})
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    finite = [r for r in all_rates if not math.isinf(r)]
    if finite:
        ax1.plot(finite, finite, ":", color="gray", label="offered rate")
    for name, _, runs in reports:
        x, y = series(runs, lambda r: r["request_throughput"], all_rates)
        line = ax1.plot(x, y, "o-", label=f"{name}: completed")[0]
        x, y = series(runs, lambda r: r.get("goodput", float("nan")), all_rates)
        ax1.plot(x, y, "s--", color=line.get_color(), label=f"{name}: goodput (SLO met)")
        x, y = series(runs, lambda r: r["output_throughput"], all_rates)
        line = ax2.plot(x, y, "o-", label=f"{name}: output")[0]
        x, y = series(runs, lambda r: r.get("total_token_throughput", float("nan")), all_rates)
        ax2.plot(x, y, "s--", color=line.get_color(), label=f"{name}: input + output")
    ax1.set_title("request throughput vs rate")
    ax1.set_ylabel("requests/s")
    ax2.set_title("token throughput vs rate")
    ax2.set_ylabel("tokens/s")
    for ax in (ax1, ax2):
        rate_axis(ax, all_rates)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_latency_vs_rate(reports, out):
    all_rates = sorted({rate_value(r["request_rate"]) for _, _, runs in reports for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"p50": "o-", "p90": "^--", "p99": "s:"}
    for ax, (key, title) in zip(axes, LATENCIES[:2]):
        drawn = []
        for name, _, runs in reports:
            color = None
            for p, style in styles.items():
                x, y = series(runs, lambda r: r[key].get(p, float("nan")) if r[key].get("n", 1) else float("nan"),
                              all_rates)
                line = ax.plot(x, y, style, color=color, label=f"{name}: {p}")[0]
                color = line.get_color()
                drawn.extend(y)
        if wide(drawn, 100):
            ax.set_yscale("log")
        ax.set_title(f"{title} vs rate")
        ax.set_ylabel(f"{title} (ms)")
        rate_axis(ax, all_rates)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def plot_cost(rows, out):
    labels = []
    for r in rows:
        what = f"{r['gpu']}" + (f" x{r['units']}" if r.get("units", 1) != 1 else "")
        what += f", {r['precision']}" if r.get("precision") else ""
        labels.append(f"{what}\n{os.path.basename(str(r.get('report', '')))}")
    y = np.arange(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, max(3.0, 1.2 + 0.7 * len(rows))), sharey=True)
    ax1.barh(y, [r["output_tok_s_per_usd_hour"] for r in rows], color="tab:green")
    ax1.set_title("output tokens/s per $/hour (higher is cheaper)")
    ax1.set_yticks(y)
    ax1.set_yticklabels(labels, fontsize="small")
    ax2.barh(y, [r["usd_per_million_output_tokens"] for r in rows], color="tab:red")
    ax2.set_title("$ per million output tokens")
    util = sorted({r.get("utilization") for r in rows if r.get("utilization") is not None})
    if util:
        fig.suptitle("at utilization " + ", ".join(f"{u:g}" for u in util), fontsize="small")
    for ax in (ax1, ax2):
        ax.grid(True, axis="x", alpha=0.3)
        ax.set_xscale("log")  # engines and devices differ by orders of magnitude
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="*", help="bench serve --output-json files")
    ap.add_argument("--cost", action="append", default=[], help="bench cost --json output (repeatable)")
    ap.add_argument("--label", action="append", default=[],
                    help="a name per report, in order (default: the file name without .json)")
    ap.add_argument("--out-dir", required=True, help="where the PNGs go (created if missing)")
    args = ap.parse_args(argv)
    if not args.reports and not args.cost:
        ap.error("give at least one report or --cost file")
    if args.label and len(args.label) != len(args.reports):
        ap.error(f"{len(args.label)} --label for {len(args.reports)} reports")
    try:
        reports = []
        for i, path in enumerate(args.reports):
            report, runs = load_report(path)
            name = args.label[i] if args.label else os.path.splitext(os.path.basename(path))[0]
            reports.append((name, report, runs))
        cost_rows = [row for path in args.cost for row in load_cost(path)]
    except InputError as e:
        print(f"plot_bench: {e}", file=sys.stderr)
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    written = []
    if reports:
        for fname, plot in [("latency_cdf.png", plot_latency_cdf), ("throughput_vs_rate.png", plot_throughput),
                            ("latency_vs_rate.png", plot_latency_vs_rate)]:
            path = os.path.join(args.out_dir, fname)
            plot(reports, path)
            written.append(path)
    if cost_rows:
        path = os.path.join(args.out_dir, "cost.png")
        plot_cost(cost_rows, path)
        written.append(path)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
