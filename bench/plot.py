"""Plots and the summary table of the admission benchmark (``bench/bench_admission.py``).

Run: ``python bench/plot.py`` (needs matplotlib: ``pip install -e '.[bench]'``). Reads every
``bench/results/admission-*.json`` (``--quick`` results only with ``--include-quick``) and writes:

* ``bench/results/admission-timeline.png``: jobs created, admitted and finished over time, one
  panel per run;
* ``bench/results/admission-latency.png``: create→Dequeued latency percentiles per run: the quiet
  latency probe, the jobs that fit at once under the load, and all jobs (log scale);

and prints a Markdown table of the key figures (the one in ``BENCHMARKS.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
from typing import Any

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
MODES = {"comparable": 0, "full": 1}


def load(include_quick: bool) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(RESULTS.glob("admission-*.json")):
        if path.name.startswith("admission-quick-") and not include_quick:
            continue
        data = json.loads(path.read_text())
        if "figures" not in data:
            continue
        data["_name"] = path.stem.removeprefix("admission-")
        runs.append(data)
    runs.sort(key=lambda r: (MODES.get(r["config"]["mode"], 9), r["config"]["jobs"], r["config"]["quotas"]))
    return runs


def label(run: dict[str, Any]) -> str:
    c = run["config"]
    return f"{c['mode']} {c['jobs']:,} jobs / {c['quotas']} quotas"


def timeline(runs: list[dict[str, Any]], out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(runs))
    rows = math.ceil(len(runs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=False):
        t = run["run"]["timeline"]
        for key, style in (("created", ":"), ("admitted", "-"), ("finished", "--")):
            points = t.get(key) or []
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=key)
        f = run["figures"]
        ax.set_title(
            f"{label(run)}\nsustained {f['sustained_rate']}/s, overall {f['overall_rate']}/s", fontsize=9
        )
        ax.set_xlabel("seconds since the first create")
        ax.set_ylabel("jobs")
        ax.axhline(run["config"]["jobs"], color="grey", linewidth=0.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    for ax in list(axes.flat)[len(runs) :]:
        ax.axis("off")
    fig.suptitle("Admission benchmark: jobs created, admitted (QueueUnit Dequeued) and finished over time")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def latency(runs: list[dict[str, Any]], out: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [
        ("probe p50", lambda r: (r["run"].get("probe") or {}).get("latency_fit", {}).get("p50_s")),
        ("probe p99", lambda r: (r["run"].get("probe") or {}).get("latency_fit", {}).get("p99_s")),
        ("fit-at-once p50", lambda r: r["run"]["latency_fit"]["p50_s"]),
        ("fit-at-once p99", lambda r: r["run"]["latency_fit"]["p99_s"]),
        ("all jobs p50", lambda r: r["run"]["latency_all"]["p50_s"]),
        ("all jobs p99", lambda r: r["run"]["latency_all"]["p99_s"]),
    ]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.9 * len(runs)), 4.6))
    for k, (name, get) in enumerate(series):
        xs, ys = [], []
        for i, run in enumerate(runs):
            value = get(run)
            if value:
                xs.append(i + (k - (len(series) - 1) / 2) * width)
                ys.append(value)
        ax.bar(xs, ys, width=width, label=name)
    ax.axhline(2.0, color="red", linewidth=0.8, linestyle="--", label="target p99 < 2 s (fit at once)")
    ax.set_yscale("log")
    ax.set_ylabel("create → Dequeued (s, log scale)")
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels([label(r).replace(" jobs / ", "\n/ ") for r in runs], fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("Admission latency: quiet probe (5 jobs/s), fit-at-once jobs under the load, all jobs")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def table(runs: list[dict[str, Any]]) -> str:
    head = (
        "| run | all admitted (s) | overall /s | sustained /s | probe p50 / p99 (s)"
        " | fit-at-once p50 / p99 (s) | writes / admitted job | raw writes/s | efficiency"
        " | CPU-bound estimate /s"
        " | reconciler CPU (s) | reconciler peak RSS (MiB) | other load (cores) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in runs:
        f = run["figures"]
        m = run["run"]["machine_during_load"]
        admitted = f["all_admitted_s"]
        if admitted is None:
            admitted = f"not all: {f['admitted']:,} in {run['run']['last_admission_s']}"
        lines.append(
            f"| {label(run)} | {admitted} | {f['overall_rate']} | {f['sustained_rate']}"
            f" | {f.get('probe_p50_s')} / {f.get('probe_p99_s')} | {f['fit_p50_s']} / {f['fit_p99_s']}"
            f" | {f['writes_per_admission']} | {f['raw_writes_per_s']} | {f['efficiency']}"
            f" | {f.get('cpu_bound_rate_estimate')} | {f['reconciler_cpu_s']}"
            f" | {f['reconciler_peak_rss_mib']}"
            f" | {m['other_cores']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--include-quick", action="store_true", help="also plot --quick results")
    args = parser.parse_args()
    runs = load(args.include_quick)
    if not runs:
        raise SystemExit("no bench/results/admission-*.json yet: run bench/bench_admission.py first")
    timeline(runs, RESULTS / "admission-timeline.png")
    latency(runs, RESULTS / "admission-latency.png")
    print(table(runs))
    print(f"\nwritten: {RESULTS / 'admission-timeline.png'}, {RESULTS / 'admission-latency.png'}")


if __name__ == "__main__":
    main()
