"""Markdown and PNG report of one bench/suite.py run.

``render`` makes the text the suite prints (plots next to the results JSON), ``write_docs`` the
published page (docs/benchmarks.md, plots in docs/benchmarks/). Both read only the document, so
a stored run re-renders without re-running: ``python -m bench.report RESULTS.json [DOCS.md]``.
Every part tolerates missing figures (None, absent sections, an interrupted run): a partial
run's report is still worth reading, and a long run must not be lost to a plotting error.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

Doc = dict[str, Any]
Fmt = Callable[[float], str]
ARM_ORDER = ("queen-mp", "queen-mp-qpb1", "naive", "pgmq", "physical", "edge")
# bench/peers.py's arms, after the PostgreSQL ones; they appear only in runs that had them.
PEER_ARMS = ("rabbitmq-quorum", "rabbitmq-classic", "nats", "nats-fsync")
ARM_ABOUT = {
    "queen-mp": "the broker, JSON push",
    "queen-mp-qpb1": "the broker, binary QPB1 zstd-framed push",
    "naive": "a falcon app under queen-mp's gunicorn command line: one INSERT and one commit per "
             "request, pop with `FOR UPDATE SKIP LOCKED`, ack by `DELETE`",
    "pgmq": "pgmq from the SQL bundled in the `pgmq` package, over psycopg (send_batch / read / "
            "delete)",
    "physical": "psycopg binary COPY of the same rows, 1,000 per commit: what PostgreSQL alone "
                "costs to keep the messages durably",
    "edge": "the ceiling of queen-mp's HTTP stack: a falcon app under the same gunicorn command "
            "line doing each request's JSON work and nothing else (no database, "
            "bench/edge_app.py)",
    "rabbitmq-quorum": "RabbitMQ, a durable quorum queue, persistent messages, publisher "
                       "confirms (aio-pika)",
    "rabbitmq-classic": "RabbitMQ, a durable classic queue, persistent messages (delivery_mode "
                        "2), publisher confirms (aio-pika)",
    "nats": "NATS JetStream, a file-storage stream, each publish waiting for its PubAck "
            "(nats-py); nats-server acknowledges **before fsync** by default",
    "nats-fsync": "NATS JetStream on a private nats-server with `sync_interval: always` (an "
                  "fsync on every write, before the PubAck)",
    "queen-mp-ephemeral": "the broker, ephemeral queues (UNLOGGED tables: no WAL, emptied by a "
                          "PostgreSQL crash), beside the same broker's durable queues (section "
                          "ephemeral, bench/ephemeral.py)",
}
ARM_COLOR = {"queen-mp": "tab:blue", "queen-mp-qpb1": "tab:purple", "naive": "tab:orange",
             "pgmq": "tab:green", "physical": "dimgray", "edge": "lightgray",
             "rabbitmq-quorum": "tab:red", "rabbitmq-classic": "tab:pink", "nats": "tab:cyan",
             "nats-fsync": "tab:olive"}
PLOTS = ("push-throughput.png", "e2e-latency-cdf.png", "wake-latency-cdf.png",
         "consume-throughput.png")


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rate(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def _bytes(v: float) -> str:
    div, unit = next(((d, u) for d, u in ((1e6, " MB"), (1e3, " kB")) if abs(v) >= d), (1, " B"))
    return f"{v / div:,.1f}{unit}" if div > 1 else f"{v:.0f} B"


def _short(v: float) -> str:
    """Axis labels: 1.2M, 35k, 800 (full numbers crowd a log axis)."""
    div, unit = next(((d, u) for d, u in ((1e6, "M"), (1e3, "k")) if abs(v) >= d), (1, ""))
    return f"{v / div:.3g}{unit}"


def _x(v: float) -> str:
    """Ratio; two significant digits below 0.1 (queen-mp batch 1 / physical is ~0.02x)."""
    return f"{v:.2f}x" if abs(v) >= 0.1 else f"{v:.2g}x"


_ms = _f1 = "{:,.1f}".format
_f2 = "{:,.2f}".format
_int = "{:,.0f}".format


def _fmt(v: Any, f: Fmt) -> str:
    return f(v) if _num(v) else "-"


# figure key -> (column header, formatter), in column order
COLUMNS: dict[str, tuple[str, Fmt]] = {
    "msgs_per_s": ("msgs/s", _rate), "requests_per_s": ("req/s", _rate),
    "pushed_per_s": ("pushed/s", _rate), "backlog_end": ("backlog at end", _int),
    "p50_ms": ("p50 ms", _ms), "p99_ms": ("p99 ms", _ms), "p999_ms": ("p99.9 ms", _ms),
    "max_ms": ("max ms", _ms), "commits_per_s": ("commits/s", _rate),
    "msgs_per_commit": ("msgs/commit", _f1), "segs_per_commit": ("segs/commit", _f1),
    "read_backs_per_seg": ("read-backs/seg", _f2),
    "sql_probes_per_seg": ("SQL probes/seg", _f2),
    "wal_bytes_per_s": ("WAL/s", _bytes), "wal_bytes_per_msg": ("WAL/msg", _bytes),
    "cpu_broker_s": ("CPU broker s", _f2), "cpu_pg_db_s": ("CPU PG db s", _f2),
    "cpu_pg_all_s": ("CPU PG all s", _f2), "cpu_client_s": ("CPU client s", _f2),
    "cpu_other_s": ("CPU other s", _f2),
    "cpu_us_per_msg": ("CPU us/msg", _f1), "cpu_broker_us_per_msg": ("broker us/msg", _f1),
    "cpu_shard_us_per_msg": ("shard us/msg", _f1),
    "cpu_pg_us_per_msg": ("PG us/msg", _f1), "cpu_client_us_per_msg": ("client us/msg", _f1),
    "busy_pct": ("busy %", _f1),
    "rss_peak_mb": ("RSS MB", _f1), "pss_peak_mb": ("PSS MB", _f1),
    "errors": ("errors", _int), "missing": ("missing", _int),
}
RATIOS = {f: (COLUMNS[f][0], _x) for f in ("msgs_per_s", "p50_ms", "p99_ms", "cpu_broker_s",
                                           "cpu_us_per_msg", "commits_per_s",
                                           "wal_bytes_per_msg")}
LEDGER_COUNTS = ("expected", "consumed", "loss", "duplicates", "redelivered", "id_mismatch",
                 "phantom", "extra_unknown")


def _arm_key(arm: str) -> tuple[int, str]:
    order = ARM_ORDER + PEER_ARMS
    return (order.index(arm) if arm in order else len(order), arm)


def _grouped(items: Iterable[Doc]) -> dict[str, list[Doc]]:
    """Items by section, each sorted by variant in order of first appearance (the suite runs
    batch 1 before batch 10, which a string sort would not keep), then arm, vs arm, round."""
    order: dict[tuple[str, str], int] = {}
    out: dict[str, list[Doc]] = {}
    for it in items:
        order.setdefault((it["section"], it["variant"]), len(order))
        out.setdefault(it["section"], []).append(it)
    for lst in out.values():
        lst.sort(key=lambda it: (order[(it["section"], it["variant"])], _arm_key(it["arm"]),
                                 _arm_key(it.get("vs", "")), it.get("round", 0)))
    return out


def _table(head: list[str], rows: Iterable[list[str]], text_cols: int = 1) -> str:
    """Markdown table; the first ``text_cols`` columns left-aligned, figures right-aligned."""
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if i < text_cols else "---:" for i in range(len(head))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _figures_table(items: list[Doc], lead: list[str],
                   heads: dict[str, tuple[str, Fmt]] = COLUMNS) -> str:
    """One row per item; a figure gets a column only if some item has it, so a section whose
    arms measure little (wake, e2e) does not drown in empty columns."""
    cols = [f for f in heads if any(_num(it.get(f)) for it in items)]
    rows = [[str(it.get(k, "")) for k in lead] + [_fmt(it.get(f), heads[f][1]) for f in cols]
            for it in items]
    return _table(lead + [heads[f][0] for f in cols], rows, text_cols=len(lead))


def _targets_md(targets: list[Doc]) -> str:
    rows = []
    ceilings = any(t.get("edge_ceiling") is not None for t in targets)
    for t in targets:
        f = _x if "(x)" in t["target"] else _f1
        verdict = {True: "**MET**", False: "**MISSED**"}.get(t.get("met"), "not measured")
        rows.append([t["target"], verdict, _fmt(t.get("value"), f),
                     f"{t['op']} {_fmt(t['threshold'], f)}",
                     *([_fmt(t.get("edge_ceiling"), f)] if ceilings else [])])
    met, unmeasured = (sum(t.get("met") is v for t in targets) for v in (True, None))
    head = ["target", "verdict", "value", "threshold"]
    note = ""
    if ceilings:
        head.append("edge ceiling")
        note = ("\n\n*edge ceiling*: the same ratio for the edge arm, queen-mp's HTTP stack "
                "doing only each request's JSON work (no database). No broker served by this "
                "stack on this machine can pass a threshold the edge does not reach.")
    return (f"{met} of {len(targets)} targets met ({unmeasured} not measured).\n\n"
            + _table(head, rows, 2) + note)


def _peers_md(doc: Doc) -> list[str]:
    """The peer arms of the run: which server answered, or why the arm was skipped, and what
    a confirmed publish means on it."""
    peers = doc.get("peers") or {}
    if not peers:
        return []
    rows = [[arm, str(p.get("server") or "-"), str(p.get("client") or "-"),
             "ran" if p.get("status") == "ran" else f"**skipped**: {p.get('reason')}",
             str(p.get("durability") or "")]
            for arm, p in sorted(peers.items(), key=lambda kv: _arm_key(kv[0]))]
    return ["## Peers", "",
            "The brokers a user would pick instead, in the same run (bench/peers.py). NATS "
            "JetStream acknowledges a publish **before fsync** by default (its file store "
            "fsyncs every `sync_interval`, 2 minutes unless configured): the `nats` arm's "
            "PubAck does not mean the message is on disk; `nats-fsync` runs a private server "
            "with `sync_interval: always`. A peer that was not reachable is skipped, never "
            "faked. \"CPU broker\" of a peer is its server process (beam.smp, nats-server).",
            "", _table(["arm", "server", "client", "status", "what a confirmed publish means"],
                       rows, 5), ""]


def _ledger_md(doc: Doc) -> str:
    ledger = doc.get("ledger") or {}
    if not ledger:
        return "No zero-loss ledger was checked in this run."
    out = [f"Overall: **{'OK' if doc.get('ledger_ok') else 'FAILED'}**"]
    for name, v in ledger.items():
        off, groups = v.get("offsets") or {}, v.get("groups") or {}
        ok = bool(v.get("ok")) and bool(off.get("ok"))
        out.append(f"**{name}**: **{'OK' if ok else 'FAILED'}**. {v.get('verdict', '')}; "
                   f"{off.get('verdict', 'offsets not checked')}.")
        out.append(_table(["group", *LEDGER_COUNTS, "verdict"], [
            [g, *(_fmt(d.get(k), _int) for k in LEDGER_COUNTS),
             "**OK**" if d.get("ok", not d.get("failures")) else "**FAILED**"]
            for g, d in groups.items()]))
        if not ok:  # enough to start the investigation; the JSON has the rest
            bad = {g: d["examples"] for g, d in groups.items() if d.get("examples")}
            if off.get("problems"):
                bad["offsets"] = off["problems"][:5]
            out.append(f"Examples:\n\n```json\n{json.dumps(bad, indent=1, default=str)[:4000]}"
                       "\n```")
    return "\n\n".join(out)


def _sections_md(doc: Doc) -> list[str]:
    """Per section its medians and, right under them, queen-mp's ratios to the other arms."""
    summary = doc.get("summary") or {}
    ratios = _grouped(summary.get("ratios") or [])
    out = []
    for sec, rows in _grouped(summary.get("rows") or []).items():
        out += [f"### {sec}", "", _figures_table(rows, ["variant", "arm", "rounds"]), ""]
        if ratios.get(sec):
            labelled = [{**r, "ratio": f"{r['arm']} / {r['vs']}" + (
                f" ({r['vs_variant']})" if r.get("vs_variant") != r["variant"] else "")}
                for r in ratios[sec]]
            out += [f"Ratios queen-mp / other arm, {sec}: above 1 is better for msgs/s, below 1 "
                    "is better for latencies, CPU, commits/s and WAL per message.", "",
                    _figures_table(labelled, ["variant", "ratio"], RATIOS), ""]
    return out


# ------------------------------------------------------------------------------ plots
def _axes(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    """An Agg figure of its own (no pyplot state): 1000 x 600 px, labels readable at that."""
    fig = Figure(figsize=(10, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=14)
    ax.set_xlabel(xlabel, fontsize=12)
    ax.set_ylabel(ylabel, fontsize=12)
    ax.tick_params(labelsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, ax: Axes, path: Path) -> Path:
    ax.legend(fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _plot_push(rows: list[Doc], path: Path) -> Path | None:
    push = [r for r in rows if r["section"] == "push" and _num(r.get("msgs_per_s"))]
    lines: dict[str, list[tuple[int, float]]] = {}
    for r in push:
        batch = r["variant"].removeprefix("batch ")
        if r["arm"] != "physical" and batch.isdigit():
            lines.setdefault(r["arm"], []).append((int(batch), r["msgs_per_s"]))
    if not lines:
        return None
    fig, ax = _axes("Push throughput by request batch size (msgs/s, median of rounds)",
                    "items per request (batch size)", "messages per second (log scale)")
    for arm in sorted(lines, key=_arm_key):
        pts = sorted(lines[arm])
        ax.plot(*zip(*pts, strict=True), marker="o", lw=2, label=arm, color=ARM_COLOR.get(arm))
        for x, y in pts:
            ax.annotate(_short(y), (x, y), textcoords="offset points", xytext=(0, 7),
                        ha="center", fontsize=9)
    for r in push:
        if r["arm"] == "physical":  # one figure (batch 1000) for every batch size: a reference
            ax.axhline(r["msgs_per_s"], ls="--", lw=2, color=ARM_COLOR["physical"],
                       label=f"physical limit (COPY, {r['variant']}): {_rate(r['msgs_per_s'])}")
    batches = sorted({x for pts in lines.values() for x, _ in pts})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
    return _save(fig, ax, path)


def _plot_cdf(samples: dict[str, list[float]], target_ms: float, title: str,
              path: Path) -> Path | None:
    """Latencies <= 0 (the consumer saw the message before the producer read the push answer)
    cannot sit on a log axis: they are drawn at the smallest positive sample, which keeps the
    CDF true there ("at or below") without stretching the axis down to nothing."""
    data = {a: [float(x) for x in s if _num(x)] for a, s in samples.items() if s}
    floor = min((x for s in data.values() for x in s if x > 0), default=0.01)
    data = {a: sorted(max(floor, x) for x in s) for a, s in data.items() if s}
    if not data:
        return None
    fig, ax = _axes(title, "latency, ms (log scale)", "fraction of messages at or below")
    for arm in sorted(data, key=_arm_key):
        xs, n = data[arm], len(data[arm])
        p50, p99 = (xs[min(n - 1, max(0, int(q * n + 0.5) - 1))] for q in (0.5, 0.99))
        ax.step(xs, [(i + 1) / n for i in range(n)], where="post", lw=2, color=ARM_COLOR.get(arm),
                label=f"{arm}: p50 {_ms(p50)} ms, p99 {_ms(p99)} ms (pooled, n={n:,})")
    ax.axvline(target_ms, color="red", ls="--", lw=1.5, label=f"target: p99 < {target_ms:g} ms")
    ax.axhline(0.99, color="gray", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.01)
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    return _save(fig, ax, path)


def _plot_consume(rows: list[Doc], path: Path) -> Path | None:
    got = {(f"{r['section']}, {r['variant']}", r["arm"]): r["msgs_per_s"] for r in rows
           if r["section"] in ("consume", "mixed") and _num(r.get("msgs_per_s"))}
    if not got:
        return None
    groups = list(dict.fromkeys(g for g, _ in got))
    arms = sorted({a for _, a in got}, key=_arm_key)
    width = 0.8 / len(arms)
    fig, ax = _axes("Consume throughput (msgs/s popped and acked, median of rounds)", "",
                    "messages per second")
    for i, arm in enumerate(arms):
        at = [(j + (i - (len(arms) - 1) / 2) * width, got[g, arm])
              for j, g in enumerate(groups) if (g, arm) in got]
        bars = ax.bar([x for x, _ in at], [v for _, v in at], width, label=arm,
                      color=ARM_COLOR.get(arm))
        ax.bar_label(bars, labels=[_rate(v) for _, v in at], fontsize=9, padding=2)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_xlim(-0.5, len(groups) - 0.5)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _short(v)))
    return _save(fig, ax, path)


def _plots(doc: Doc, out: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """Draw every plot that has data into ``out``: (caption, file) pairs and failures."""
    out.mkdir(parents=True, exist_ok=True)
    rows = (doc.get("summary") or {}).get("rows") or []
    wake = next((r["variant"] for r in rows if r["section"] == "wake"), "parked pops")
    jobs: list[tuple[str, Callable[[Path], Path | None]]] = [
        ("Push throughput", lambda p: _plot_push(rows, p)),
        ("End-to-end latency", lambda p: _plot_cdf(
            doc.get("e2e_samples_ms") or {}, 20.0,
            "End-to-end latency, push answered to message received (ms, CDF)", p)),
        ("Wake latency", lambda p: _plot_cdf(
            {"queen-mp": doc.get("wake_samples_ms") or []}, 50.0,
            f"Wake latency of parked pops, {wake} (ms, CDF)", p)),
        ("Consume throughput", lambda p: _plot_consume(rows, p)),
    ]
    made, failed = [], []
    for (caption, job), name in zip(jobs, PLOTS, strict=True):
        (out / name).unlink(missing_ok=True)  # never link a stale plot of an earlier run
        try:
            path = job(out / name)
        except Exception as ex:
            failed.append(f"plot {name} failed: {type(ex).__name__}: {ex}")
            continue
        if path is not None:
            made.append((caption, path))
    return made, failed


# ------------------------------------------------------------------------------ documents
def _intro(doc: Doc, title: str, about_arms: bool) -> list[str]:
    m = doc.get("machine") or {}
    pg = ", ".join(f"{k}={v}" for k, v in (m.get("postgres_settings") or {}).items())
    dirty = m.get("git_dirty_tracked_files")
    out = [f"# {title}", ""]
    if about_arms:
        arms = sorted({r["arm"] for r in (doc.get("summary") or {}).get("rows") or []},
                      key=_arm_key)
        out += ["`bench/suite.py` runs queen-mp and its peers on one PostgreSQL with one payload "
                "(200-byte JSON). Every cell alternates the arms and every figure is the median "
                "of the rounds; queen-mp's figures are also given as ratios to the other arms. "
                "bench/README.md says how each arm and figure is built. Arms:", "",
                *(f"- **{a}**: {ARM_ABOUT.get(a, '')}" for a in arms), ""]
    out += [f"- command: `.venv/bin/{doc.get('command', '')}`",
            f"- started {doc.get('started_at')}, took {_fmt(doc.get('elapsed_s'), _int)} s, "
            f"status **{doc.get('status')}**"
            + (f": {doc['failure']}" if doc.get("failure") else ""),
            f"- machine: {m.get('nproc')} CPUs ({m.get('cpu_model')}), load average at start "
            f"{', '.join(_f2(x) for x in m.get('loadavg_at_start') or [])}; Python "
            f"{m.get('python')}; PostgreSQL {m.get('postgres_version')} ({pg}); pgmq SQL "
            f"{doc.get('pgmq_sql_version')}",
            f"- git commit {m.get('git_commit')}"
            + (f" with {dirty} modified tracked file(s)" if dirty else ""),
            "- background commits/s with no load, measured before the run: " + ", ".join(
                f"{a} {_f1(v)}" for a, v in (doc.get("idle_commits_per_s") or {}).items()), ""]
    return out


def _markdown(doc: Doc, plots: list[tuple[str, Path]], failed: list[str], base: Path,
              title: str, full: bool) -> str:
    """The shared document; ``full`` (the run's own report) adds every round and the logs."""
    out = [*_intro(doc, title, about_arms=not full),
           "## Targets", "", _targets_md((doc.get("summary") or {}).get("targets") or []), "",
           *_peers_md(doc),
           "## Results (medians of the rounds)", "", *_sections_md(doc),
           "## Zero-loss ledger", "", _ledger_md(doc), ""]
    if plots or failed:
        out += ["## Plots", "", *(f"![{c}]({p.relative_to(base).as_posix()})\n"
                                  for c, p in plots), *failed]
    if full:
        out += ["", "## Every round", ""]
        for sec, cells in _grouped(doc.get("cells") or []).items():
            heads = {f: COLUMNS[f] for f in ("msgs_per_s", "p50_ms", "p99_ms", "errors")}
            out += [f"### {sec}", "", _figures_table(cells, ["variant", "arm", "round"], heads),
                    ""]
        if logs := doc.get("logs"):
            out += ["## Server logs", "", _table(
                ["server", "exit", "warn/error lines", "most frequent"],
                [[s, str(f.get("exit_code")), _fmt(f.get("warning_or_error_lines"), _int),
                  "; ".join(f"{d['count']}x {d['line'][:100]}"
                            for d in (f.get("distinct") or [])[:2])]
                 for s, f in logs.items()], 4), ""]
    if doc.get("notes"):
        out += ["## Notes", "", *(f"- {n}" for n in doc["notes"]), ""]
    return "\n".join(out).rstrip() + "\n"


def render(doc: Doc, plots_dir: Path) -> str:
    """The run's report (printed by the suite); plots go to ``plots_dir``, linked relative to
    its parent, where the results JSON lives."""
    plots, failed = _plots(doc, plots_dir)
    return _markdown(doc, plots, failed, plots_dir.parent,
                     f"Benchmark suite run {doc.get('started_at')}", full=True)


def write_docs(doc: Doc, path: Path) -> None:
    """The published page: ``path`` plus its plots in ``path.parent / "benchmarks"``."""
    plots, failed = _plots(doc, path.parent / "benchmarks")
    path.write_text(_markdown(doc, plots, failed, path.parent, "Benchmarks", full=False))


if __name__ == "__main__":
    results = Path(sys.argv[1])
    document = json.loads(results.read_text())
    print(render(document, results.with_suffix("")))
    if len(sys.argv) > 2:
        write_docs(document, Path(sys.argv[2]))
