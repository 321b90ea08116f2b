"""The files under ``ops/``: the Grafana dashboard queries only metrics the broker exports (the
families declared in ``queen_mp/metrics.py``, with their labels), the systemd unit parses and
carries its readiness check, stop budget and hardening, the env example names real settings,
and the Prometheus configuration scrapes ``/metrics/prometheus``.
"""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from queen_mp.config import SETTINGS
from queen_mp.metrics import QUEUE_GAUGES, Metrics

OPS = Path(__file__).resolve().parents[2] / "ops"
DASHBOARD = OPS / "grafana" / "queen-mp.json"
UNIT = OPS / "systemd" / "queen-mp.service"
ENV_EXAMPLE = OPS / "systemd" / "queen-mp.env.example"
PROMETHEUS = OPS / "prometheus" / "prometheus.yml"

# labels Prometheus attaches to every scraped series
TARGET_LABELS = {"job", "instance"}


# ------------------------------------------------------------------------ exported metrics
def exported_series() -> dict[str, set[str]]:
    """Every series name ``/metrics/prometheus`` can carry -> its label names."""
    out: dict[str, set[str]] = {}
    for metric in vars(Metrics()).values():
        kind = getattr(metric, "_type", None)
        if kind is None:
            continue
        name, labels = metric._name, set(metric._labelnames)
        if kind == "counter":
            out[f"{name}_total"] = labels
        elif kind == "histogram":
            out[f"{name}_bucket"] = labels | {"le"}
            out[f"{name}_sum"] = labels
            out[f"{name}_count"] = labels
        else:
            out[name] = labels
    # the per-queue gauges come from shard 0's snapshot, not from per-process samples
    for name, (_, labels) in QUEUE_GAUGES.items():
        out[name] = set(labels)
    out["queen_queue_gauges_timestamp_seconds"] = set()
    return out


def test_exported_series_match_a_scrape_shape():
    series = exported_series()
    # api.md 2.12 requires these; the dashboard builds on them
    for name in ("queen_batch_items_fired_total", "queen_fusion_items_per_batch_bucket",
                 "queen_http_requests_total", "queen_spool_pending", "queen_maintenance_mode",
                 "queen_parked_pops", "queen_dlq_depth"):
        assert name in series, name
    assert series["queen_http_requests_total"] == {"route", "status"}
    assert series["queen_http_request_duration_seconds_bucket"] == {"route", "le"}


# ------------------------------------------------------------------------------- dashboard
def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows nest theirs
    return out


def expressions(dash: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) of every target, plus the variables' queries."""
    out = [(p["title"], t["expr"], t.get("legendFormat", ""))
           for p in panels(dash) if p["type"] != "row" for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            out.append((f"${var['name']}", query, ""))
    return out


_NAME = re.compile(r"\b(queen_[a-zA-Z0-9_]+)\b")
_SELECTOR = re.compile(r"\b(queen_[a-zA-Z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_LABEL_VALUES = re.compile(r"label_values\((?:[^,]*,)?\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)")


def test_dashboard_is_valid_grafana_json():
    dash = load_dashboard()
    assert 36 <= dash["schemaVersion"] <= 40
    assert dash["uid"] and dash["title"] and dash.get("id") is None
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels(dash):
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), (p["title"], t["expr"])
            assert t["expr"].count("{") == t["expr"].count("}"), (p["title"], t["expr"])
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == "${datasource}"


def test_dashboard_queries_only_exported_metrics_and_labels():
    series = exported_series()
    seen: set[str] = set()
    for title, expr, legend in expressions(load_dashboard()):
        names = set(_NAME.findall(expr))
        assert names, (title, expr)
        unknown = names - set(series)
        assert not unknown, f"{title}: {sorted(unknown)} not exported by queen_mp/metrics.py"
        seen |= names
        for name, matchers in _SELECTOR.findall(expr):
            used = set(_MATCHER.findall(matchers))
            assert used <= series[name] | TARGET_LABELS, (title, name, used - series[name])
        available = set().union(*(series[n] for n in names)) | TARGET_LABELS
        grouped: set[str] = set()
        for group in _GROUPING.findall(expr):
            labels = {x.strip() for x in group.split(",") if x.strip()}
            assert labels <= available, (title, labels - available)
            grouped |= labels
        for label in _LEGEND.findall(legend):
            assert label in grouped, (title, f"legend {{{{{label}}}}} not kept by the query")
        for label in _LABEL_VALUES.findall(expr):
            assert label in available, (title, label)
    # the panels the dashboard promises
    for name in ("queen_messages_pushed_total", "queen_messages_popped_total",
                 "queen_messages_acked_total", "queen_http_request_duration_seconds_bucket",
                 "queen_http_requests_total", "queen_fusion_segments_total",
                 "queen_fusion_commits_total", "queen_fusion_items_per_batch_bucket",
                 "queen_ack_fusion_rows_total", "queen_ack_fusion_commits_total",
                 "queen_ack_registry_lookups_total", "queen_spool_pending",
                 "queen_maintenance_mode", "queen_parked_pops", "queen_shard_restarts_total",
                 "queen_dlq_depth", "queen_dedup_filter_entries",
                 "queen_dedup_filter_spilled_entries", "queen_dedup_read_backs_total",
                 "queen_dedup_sql_probes_total",
                 "queen_queue_depth", "queen_queue_oldest_unconsumed_age_seconds",
                 "queen_consumer_lag_messages", "queen_consumer_lag_seconds",
                 "queen_pg_pool_connections", "queen_pg_pool_waiting",
                 "queen_pg_statement_timeouts_total", "queen_pg_cancels_total",
                 "queen_pg_quarantines_total", "queen_disk_used_percent"):
        assert name in seen, f"no panel queries {name}"


def test_dashboard_has_a_row_per_queue_and_links_the_console():
    dash = load_dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    queue = variables["queue"]
    assert queue["type"] == "query" and queue["multi"] and queue["includeAll"]
    assert "label_values(queen_queue_depth{" in queue["query"]["query"]
    all_panels = dash["panels"]
    (repeated,) = [i for i, p in enumerate(all_panels) if p.get("repeat") == "queue"]
    assert all_panels[repeated]["type"] == "row" and not all_panels[repeated]["collapsed"]
    # a row that is not collapsed owns the panels up to the next row
    owned = []
    for p in all_panels[repeated + 1:]:
        if p["type"] == "row":
            break
        owned.append(p)
    exprs = [t["expr"] for p in owned for t in p["targets"]]
    assert exprs and all('queue="$queue"' in e for e in exprs), exprs
    for name in ("queen_queue_depth", "queen_queue_oldest_unconsumed_age_seconds",
                 "queen_consumer_lag_messages", "queen_consumer_lag_seconds",
                 "queen_dlq_depth"):
        assert any(name in e for e in exprs), name
    links = [link["url"] for link in dash["links"]]
    assert any(url.endswith("/console") for url in links), links
    assert variables["broker"]["type"] == "textbox"


def test_dashboard_selects_job_and_instance_everywhere():
    for title, expr, _ in expressions(load_dashboard()):
        if title.startswith("$"):
            continue
        for name, matchers in _SELECTOR.findall(expr):
            assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (
                title, name)
        assert len(_SELECTOR.findall(expr)) == len(_NAME.findall(expr)), (title, expr)


# --------------------------------------------------------------------------------- systemd
def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """systemd's INI dialect: repeated keys accumulate, '#'/';' comments, '\\' continues."""
    out: dict[str, dict[str, list[str]]] = {}
    section: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"key outside a section: {line!r}"
        key, sep, value = line.partition("=")
        assert sep, f"not key=value: {line!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)\s*(s|min|m)?", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) in ("min", "m") else 1)


def test_systemd_unit_parses_as_ini():
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment, method-assign]
    cp.read_string(UNIT.read_text())
    assert cp.sections() == ["Unit", "Service", "Install"]
    assert cp["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_unit_service_settings():
    unit = parse_unit(UNIT.read_text())
    svc = {k: v[-1] for k, v in unit["Service"].items()}
    assert svc["Type"] == "simple"
    assert svc["ExecStart"].endswith("/bin/queen-mp serve")
    ready = unit["Service"]["ExecStartPost"]
    assert len(ready) == 1 and re.search(r"/queenctl .*health --wait \d+", ready[0]), ready
    wait_s = int(re.search(r"--wait (\d+)", ready[0]).group(1))
    assert _seconds(svc["TimeoutStartSec"]) > wait_s
    assert svc["Restart"] == "on-failure"
    assert svc["KillSignal"] == "SIGTERM" and svc["KillMode"] == "mixed"
    # front workers (S), then each shard in turn (S), then the embedded PostgreSQL (<= 70 s)
    defaults = {s.env: s.default for s in SETTINGS}
    budget = defaults["QUEEN_SHUTDOWN_TIMEOUT_S"]
    worst = budget + defaults["QUEEN_V2_FUSION_SHARDS"] * budget + 70
    assert _seconds(svc["TimeoutStopSec"]) > worst
    assert svc["User"] not in ("", "root") and svc["Group"] not in ("", "root")
    assert svc["StateDirectory"] == "queen-mp"
    assert int(svc["LimitNOFILE"]) >= 65536
    envs = dict(e.split("=", 1) for e in unit["Service"]["Environment"])
    assert envs["QUEEN_DATA_DIR"] == "/var/lib/queen-mp"
    assert envs["QUEEN_URL"].startswith("http://")
    assert unit["Service"]["EnvironmentFile"] == ["-/etc/queen-mp/queen-mp.env"]


def test_systemd_unit_hardening():
    svc = {k: v[-1] for k, v in parse_unit(UNIT.read_text())["Service"].items()}
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices",
                "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
                "RestrictSUIDSGID", "LockPersonality", "RestrictRealtime", "RestrictNamespaces"):
        assert svc.get(key) == "yes", key
    assert svc["ProtectSystem"] == "strict"
    assert svc["CapabilityBoundingSet"] == ""
    families = set(svc["RestrictAddressFamilies"].split())
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify(tmp_path):
    """Unknown keys and bad values, as systemd itself sees them (its complaints about the
    install paths not existing on this machine are expected)."""
    unit = tmp_path / "queen-mp.service"
    unit.write_text(UNIT.read_text())
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60, check=False)
    problems = [line for line in (r.stdout + r.stderr).splitlines()
                if "queen-mp.service" in line and "is not executable" not in line
                and "/opt/queen-mp/" not in line]
    assert not problems, problems


def test_env_example_names_real_settings():
    known = {s.env for s in SETTINGS} | {"QUEEN_URL", "QUEEN_TOKEN"}
    named = []
    for line in ENV_EXAMPLE.read_text().splitlines():
        stripped = line.strip()
        assert not stripped or stripped.startswith("#") or re.fullmatch(
            r"[A-Z_][A-Z0-9_]*=.*", stripped), line
        match = re.fullmatch(r"#?\s*(QUEEN_[A-Z0-9_]+)=.*", stripped)
        if match:
            named.append(match.group(1))
    assert set(named) <= known, set(named) - known
    for essential in ("QUEEN_HOST", "QUEEN_PORT", "QUEEN_URL", "QUEEN_PG_DSN", "QUEEN_WORKERS",
                      "QUEEN_V2_FUSION_SHARDS", "QUEEN_SHUTDOWN_TIMEOUT_S", "QUEEN_DATA_DIR",
                      "QUEEN_JWT_ENABLED", "QUEEN_ENCRYPTION_KEY"):
        assert essential in named, essential


# ------------------------------------------------------------------------------ prometheus
def parse_yaml_subset(text: str) -> Any:
    """Block mappings and sequences of plain scalars, as ``prometheus.yml`` uses; raises on
    anything else (tabs, flow style, bad indentation), so a broken edit fails here."""
    lines = []
    for n, raw in enumerate(text.splitlines(), 1):
        assert "\t" not in raw, f"line {n}: tab"
        body = re.sub(r"\s+#.*$", "", raw) if not raw.lstrip().startswith("#") else ""
        if body.strip():
            lines.append((n, len(body) - len(body.lstrip(" ")), body.strip()))

    def scalar(text: str) -> Any:
        assert text[:1] not in "[{&*!|>", f"unsupported YAML: {text!r}"
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        if text in ("true", "false"):
            return text == "true"
        return text.strip("'\"")

    pos = 0

    def block(indent: int) -> Any:
        nonlocal pos
        n, ind, body = lines[pos]
        assert ind == indent, f"line {n}: indentation {ind}, expected {indent}"
        if body.startswith("- ") or body == "-":
            seq = []
            while pos < len(lines) and lines[pos][1] == indent and lines[pos][2][:1] == "-":
                n, ind, body = lines[pos]
                rest = body[1:].lstrip()
                if re.match(r"[\w.-]+:(\s|$)", rest):  # "- key: value" opens a mapping
                    lines[pos] = (n, indent + 2, rest)
                    seq.append(block(indent + 2))
                else:
                    seq.append(scalar(rest))
                    pos += 1
            return seq
        mapping: dict[str, Any] = {}
        while pos < len(lines) and lines[pos][1] == indent:
            n, ind, body = lines[pos]
            match = re.fullmatch(r"([\w.-]+):(?:\s+(.*))?", body)
            assert match, f"line {n}: not 'key: value': {body!r}"
            key, value = match.group(1), match.group(2)
            assert key not in mapping, f"line {n}: duplicate key {key}"
            pos += 1
            if value:
                mapping[key] = scalar(value)
            else:
                assert pos < len(lines) and lines[pos][1] > indent, f"line {n}: empty {key}"
                mapping[key] = block(lines[pos][1])
        assert pos == len(lines) or lines[pos][1] < indent, (
            f"line {lines[pos][0]}: bad indentation")
        return mapping

    doc = block(0)
    assert pos == len(lines)
    return doc


def _check_prometheus(doc: dict[str, Any]) -> None:
    (job,) = [j for j in doc["scrape_configs"] if j["job_name"] == "queen-mp"]
    assert job["metrics_path"] == "/metrics/prometheus"
    targets = [t for sc in job["static_configs"] for t in sc["targets"]]
    assert targets and all(re.fullmatch(r"[\w.-]+:\d+", t) for t in targets), targets


def test_prometheus_yml_subset_parse():
    _check_prometheus(parse_yaml_subset(PROMETHEUS.read_text()))


def test_prometheus_yml_with_pyyaml():
    yaml = pytest.importorskip("yaml")
    _check_prometheus(yaml.safe_load(PROMETHEUS.read_text()))


def test_yaml_subset_parser_rejects_bad_indentation():
    with pytest.raises(AssertionError):
        parse_yaml_subset("a:\n  b: 1\n   c: 2\n")
    with pytest.raises(AssertionError):
        parse_yaml_subset("a: [1, 2]\n")
    assert parse_yaml_subset("a:\n  - x: 1\n    y: z\n  - w\nb: true\n") == {
        "a": [{"x": 1, "y": "z"}, "w"], "b": True}
