#!/usr/bin/env python3
"""Turns bench/run.sh results (JSON lines) into tables, ratios and a chart.

  bench/report.py --check RESULTS     fail unless every system drained and the latency checks
                                      saw no gap (and no duplicate under exactly-once)
  bench/report.py RESULTS [--chart PNG]
                                      print the Markdown tables and ratios; draw the chart
                                      (matplotlib) when asked
"""

import argparse
import json
import sys

NAMES = {
    "kafka-producer-perf": "Kafka producer perf tool (ceiling, produce only)",
    "kafka-consumer-perf": "Kafka consumer perf tool (ceiling, consume only)",
    "loadgen": "librdkafka producer, loadgen preload (ceiling, produce only)",
    "exactly-alo": "exactly --guarantee at-least-once",
    "exactly-eos-10": "exactly exactly-once, commit 10 ms",
    "exactly-eos-100": "exactly exactly-once, commit 100 ms",
    "exactly-eos-1000": "exactly exactly-once, commit 1000 ms",
    "kstreams-alo": "Kafka Streams at_least_once, commit 100 ms",
    "kstreams-eos-100": "Kafka Streams exactly_once_v2, commit 100 ms",
    "kstreams-eos-100-own": "Kafka Streams exactly_once_v2, commit 100 ms, its own producer defaults",
    "exactly-call": "exactly exactly-once, commit 100 ms, through the call-out (1 ms application, 500 a call)",
}
KS_EOS = ("kstreams-eos-100", "kstreams-eos-100-own")


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def bucket_quantile(buckets, q):
    """Upper bound of the histogram bucket holding quantile q: [(le, cumulative count)]."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    for le, count in buckets:
        if total and count >= q * total:
            return le
    return None


def commit_stats(metrics_text):
    """(mean, p99 bucket bound) of exactly's commit durations, in seconds."""
    buckets, total, count = [], 0.0, 0.0
    for line in metrics_text.splitlines():
        if line.startswith("exactly_transaction_commit_duration_seconds_sum "):
            total = float(line.split()[-1])
        if line.startswith("exactly_transaction_commit_duration_seconds_count "):
            count = float(line.split()[-1])
        if line.startswith("exactly_transaction_commit_duration_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    return (total / count if count else None), bucket_quantile(buckets, 0.99)


def check(rows):
    problems = []
    drains = [r for r in rows if r["kind"] == "drain"]
    if not drains:
        problems.append("no drain results")
    for r in drains:
        if r["result"].get("records_per_second", 0) <= 0:
            problems.append(f"drain {r['system']} {r['size']} {r['transform']}: no throughput")
    for r in rows:
        if r["kind"] == "partitions" and r["result"].get("records_per_second", 0) <= 0:
            problems.append(f"partitions {r['result'].get('partitions')}: no throughput")
    lat = [r for r in rows if r["kind"] == "latency"]
    if not lat:
        problems.append("no latency results")
    for r in lat:
        c, g = r["result"]["checker"], r["result"]["generator"]
        if c["distinct"] != g["sent"] or c["missing_below_max"] != 0:
            problems.append(f"latency {r['system']}: sent {g['sent']}, distinct {c['distinct']}, missing {c['missing_below_max']}")
        if "eos" in r["system"] and c["duplicates"] != 0:
            problems.append(f"latency {r['system']}: {c['duplicates']} duplicates under exactly-once")
        if c["measured"] == 0:
            problems.append(f"latency {r['system']}: nothing measured after the warm-up")
    for p in problems:
        print("report.py:", p, file=sys.stderr)
    return not problems


def drain_table(rows, size):
    out = [
        f"| system | transform | records/s (steady) | records/s (whole) | MB/s | CPU s per 1M records | peak RSS MB | commits | commit mean | commit p99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bpr = next((r["result"]["bytes_per_record"] for r in rows if r["kind"] == "preload" and r["size"] == size), int(size))
    for r in rows:
        if r["size"] != size or r["kind"] not in ("drain", "ceiling", "preload"):
            continue
        res = r["result"]
        rps = records_per_second(r)
        whole = res.get("whole_records_per_second")
        cpu = res.get("cpu_seconds_per_million")
        rss = res.get("peak_rss_kb")
        mean, p99 = commit_stats(res["metrics"]) if res.get("metrics") else (None, None)
        commits = None
        for line in res.get("metrics", "").splitlines():
            if line.startswith("exactly_transaction_commit_duration_seconds_count "):
                commits = int(float(line.split()[-1]))
        out.append(
            f"| {NAMES.get(r['system'], r['system'])} | {r['transform']} | {rps:,.0f} | "
            + (f"{whole:,.0f}" if whole else "–")
            + f" | {rps * bpr / 1e6:,.1f} | "
            + (f"{cpu:,.1f}" if cpu is not None else "–")
            + " | "
            + (f"{rss / 1024:,.0f}" if rss else "–")
            + " | "
            + (f"{commits:,}" if commits is not None else "–")
            + " | "
            + (f"{mean * 1000:.1f} ms" if mean is not None else "–")
            + " | "
            + (f"≤ {p99 * 1000:g} ms" if p99 is not None else "–")
            + " |"
        )
    return "\n".join(out)


def records_per_second(row):
    """A drain's or ceiling's records/s; a preload's is its records over its whole time (the
    producer's start and final flush included)."""
    res = row["result"]
    if row["kind"] == "preload":
        return res["records"] / max(res["seconds"], 1e-9)
    return res["records_per_second"]


def produce_ceiling(rows, size):
    """librdkafka's produce-only rate: loadgen's preload of the input, with its settings."""
    return next((records_per_second(r) for r in rows if r["kind"] == "preload" and r["size"] == size), None)


def drain(rows, system, size, transform):
    for r in rows:
        if r["kind"] == "drain" and (r["system"], r["size"], r["transform"]) == (system, size, transform):
            return r["result"]
    return None


def ks_best(rows, size, transform):
    """Kafka Streams exactly_once_v2's faster run (shared or its own producer settings)."""
    runs = [r for r in (drain(rows, s, size, transform) for s in KS_EOS) if r]
    return max(runs, key=lambda r: r["records_per_second"]) if runs else None


def ratio_rows(rows):
    """Per size and transform at 100 ms: exactly-once against at-least-once, Kafka Streams'
    best EOS v2 run (steady and whole drains), the produce-only ceiling; CPU and RSS ratios."""
    out = []
    for size, label in (("100", "~100 B"), ("1000", "~1 KB")):
        for t in ("passthrough", "jq"):
            eos, alo, ks = drain(rows, "exactly-eos-100", size, t), drain(rows, "exactly-alo", size, t), ks_best(rows, size, t)
            if not (eos and alo and ks):
                continue
            ceiling = produce_ceiling(rows, size)
            whole = eos.get("whole_records_per_second"), ks.get("whole_records_per_second")
            out.append({
                "label": label, "size": size, "transform": t,
                "eos_alo": eos["records_per_second"] / alo["records_per_second"],
                "eos_ks": eos["records_per_second"] / ks["records_per_second"],
                "eos_ks_whole": whole[0] / whole[1] if all(whole) else None,
                "eos_ceiling": eos["records_per_second"] / ceiling if ceiling else None,
                "cpu": eos["cpu_seconds_per_million"] / min(drain(rows, s, size, t)["cpu_seconds_per_million"] for s in KS_EOS if drain(rows, s, size, t)),
                "rss": eos["peak_rss_kb"] / ks["peak_rss_kb"],
                "rss_mb": max(drain(rows, s, size, t)["peak_rss_kb"] for s in ("exactly-eos-100", "exactly-alo")) / 1024,
            })
    return out


def fmt(x, digits=2):
    return f"{x:.{digits}f}" if x is not None else "–"


def ratios(rows):
    head = [
        "| record size | transform | exactly-once ÷ at-least-once (throughput) | exactly ÷ Kafka Streams EOS v2, its best (steady) | the same, whole drain | exactly ÷ librdkafka produce-only | CPU per record (exactly ÷ KS, its lower) | peak RSS (exactly ÷ KS) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines = [
        f"| {r['label']} | {r['transform']} | {fmt(r['eos_alo'])} | {fmt(r['eos_ks'])} | {fmt(r['eos_ks_whole'])} | "
        f"{fmt(r['eos_ceiling'])} | {fmt(r['cpu'])} | {fmt(r['rss'], 3)} |"
        for r in ratio_rows(rows)
    ]
    return "\n".join(head + lines)


def spread(rows, partitions):
    """The partitions step's drain from `partitions` partitions."""
    return next((r["result"] for r in rows if r["kind"] == "partitions" and r["result"].get("partitions") == partitions), None)


def targets(rows):
    """Issue 27's targets, each with what this run measured."""
    rr = {(r["size"], r["transform"]): r for r in ratio_rows(rows)}
    def pick(size, t, key):
        return rr.get((size, t), {}).get(key)
    def row(name, values, target, ok, digits=2):
        shown = " / ".join(fmt(v, digits) for v in values)
        met = "yes" if values and all(v is not None and ok(v) for v in values) else "no"
        return f"| {name} | {shown} | {target} | {met} |"
    out = ["| measure, 100 ms commits | measured | target | met? |", "|---|---|---|---|"]
    out.append(row("exactly EOS ÷ Kafka Streams EOS v2 (its best), ~100 B passthrough", [pick("100", "passthrough", "eos_ks")], "≥ 1.5", lambda v: v >= 1.5))
    out.append(row("exactly EOS ÷ produce-only ceiling, ~100 B", [pick("100", "passthrough", "eos_ceiling")], "≥ 0.9", lambda v: v >= 0.9))
    rss = [r["rss_mb"] for r in rr.values()]
    out.append(row("peak RSS MB, shipped defaults (exactly EOS and ALO, each size and transform)", rss, "≤ 64 MB", lambda v: v <= 64, 0))
    out.append(row("jq enrichment ÷ Kafka Streams, ~100 B", [pick("100", "jq", "eos_ks")], "≥ 1.2", lambda v: v >= 1.2))
    out.append(row("~1 KB passthrough ÷ Kafka Streams", [pick("1000", "passthrough", "eos_ks")], "≥ 2.0", lambda v: v >= 2.0))
    out.append(row("CPU s per 1M records, jq ~100 B, ÷ Kafka Streams", [pick("100", "jq", "cpu")], "≤ 0.6", lambda v: v <= 0.6))
    call = drain(rows, "exactly-call", "100", "passthrough")
    out.append(row("call-out, ~100 B, application answering in 1 ms, 500 per call (thousand records/s)",
                   [call["records_per_second"] / 1000 if call else None], "≥ 300", lambda v: v >= 300, 0))
    p99 = [r["result"]["checker"]["p99_ms"] for r in rows
           if r["kind"] == "latency" and r["system"] == "exactly-eos-100" and r["result"]["load_percent"] == 50]
    out.append(row("p99 end-to-end ms at 50 % of at-least-once's maximum load", p99, "≤ 150 ms", lambda v: v <= 150, 1))
    six, thousand = spread(rows, 6), spread(rows, 1000)
    out.append(row("peak RSS MB with 1,000 assigned partitions", [thousand["peak_rss_kb"] / 1024 if thousand else None], "≤ 128 MB", lambda v: v <= 128, 0))
    out.append(row("throughput with 1,000 partitions ÷ with 6",
                   [thousand["records_per_second"] / six["records_per_second"] if six and thousand else None], "≥ 0.8", lambda v: v >= 0.8))
    return "\n".join(out)


def spread_table(rows):
    out = ["| partitions (input and output) | records/s (steady) | CPU s per 1M records | peak RSS MB |", "|---:|---:|---:|---:|"]
    for r in rows:
        if r["kind"] == "partitions":
            res = r["result"]
            out.append(f"| {res['partitions']:,} | {res['records_per_second']:,.0f} | {res['cpu_seconds_per_million']:.1f} | {res['peak_rss_kb'] / 1024:,.0f} |")
    return "\n".join(out)


def latency_table(rows):
    out = [
        "| system | load | rate (records/s) | p50 ms | p99 ms | p99.9 ms | max ms | measured | gaps | duplicates |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["kind"] != "latency":
            continue
        res, c = r["result"], r["result"]["checker"]
        out.append(
            f"| {NAMES.get(r['system'], r['system'])} | {res['load_percent']} % | {res['rate']:,} | {c['p50_ms']:.1f} | "
            f"{c['p99_ms']:.1f} | {c['p999_ms']:.1f} | {c['max_ms']:.1f} | {c['measured']:,} | "
            f"{c['missing_below_max']} | {c['duplicates']} |"
        )
    return "\n".join(out)


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["exactly-alo", "exactly-eos-10", "exactly-eos-100", "exactly-eos-1000", "kstreams-alo", "kstreams-eos-100", "kstreams-eos-100-own"]
    short = ["exactly\nALO", "exactly\nEOS 10ms", "exactly\nEOS 100ms", "exactly\nEOS 1s", "KStreams\nALO", "KStreams\nEOS v2", "KStreams\nEOS v2 own"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for ax, size, label in ((axes[0], "100", "~100 B records"), (axes[1], "1000", "~1 KB records")):
        width = 0.38
        for i, t in enumerate(("passthrough", "jq")):
            vals = [(drain(rows, s, size, t) or {}).get("records_per_second", 0) / 1000 for s in systems]
            ax.bar([x + (i - 0.5) * width for x in range(len(systems))], vals, width, label=t)
        ax.set_xticks(range(len(systems)), short, fontsize=8)
        ax.set_ylabel("thousand records/s (drain)")
        ax.set_title(f"Throughput, {label}")
        ax.legend()
    ax = axes[2]
    for r in rows:
        if r["kind"] == "partitions" and r["result"].get("records_per_second", 0) <= 0:
            problems.append(f"partitions {r['result'].get('partitions')}: no throughput")
    lat = [r for r in rows if r["kind"] == "latency"]
    for system in ("exactly-alo", "exactly-eos-100", "kstreams-eos-100"):
        pts = sorted((r["result"]["load_percent"], r["result"]["checker"]) for r in lat if r["system"] == system)
        if pts:
            ax.plot([p[0] for p in pts], [p[1]["p99_ms"] for p in pts], marker="o", label=f"{NAMES[system]} p99")
            ax.plot([p[0] for p in pts], [p[1]["p50_ms"] for p in pts], marker=".", linestyle="--", label=f"{NAMES[system]} p50")
    ax.set_yscale("log")
    ax.set_xlabel("load, % of at-least-once maximum")
    ax.set_ylabel("end-to-end latency, ms")
    ax.set_title("Latency (~100 B, passthrough)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--chart")
    a = ap.parse_args()
    rows = load(a.results)
    if a.check:
        sys.exit(0 if check(rows) else 1)
    print("### Drain throughput, ~100 B\n")
    print(drain_table(rows, "100"))
    print("\n### Drain throughput, ~1 KB\n")
    print(drain_table(rows, "1000"))
    print("\n### Ratios at a 100 ms commit interval\n")
    print(ratios(rows))
    print("\n### Scale in partitions (~100 B passthrough, exactly-once at 100 ms)\n")
    print(spread_table(rows))
    print("\n### Targets\n")
    print(targets(rows))
    print("\n### End-to-end latency (~100 B, passthrough, open-loop load)\n")
    print(latency_table(rows))
    if a.chart:
        chart(rows, a.chart)


if __name__ == "__main__":
    main()
