"""The dashboard's expressions evaluated by promtool against synthetic traffic (the recording
rules included): panels follow the ``$registry`` variable and show a gap, not NaN, when idle."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "tool-shortlist.json"
RECORDING = ROOT / "deploy" / "prometheus" / "rules" / "recording.yml"
README = ROOT / "deploy" / "README.md"
PROMTOOL = shutil.which("promtool")


def _panels() -> dict[str, dict[str, Any]]:
    return {p["title"]: p for p in json.loads(DASHBOARD.read_text())["panels"]}


def _expr(title: str, ref: str = "A", registry: str = ".*") -> str:
    (target,) = [t for t in _panels()[title]["targets"] if t["refId"] == ref]
    expr = target["expr"].replace("$__rate_interval", "5m").replace("$__range", "1h")
    return re.sub(r"\$\{?registry\}?", registry, expr)


def _flat_after(per_minute: float, minutes: int = 60, idle: int = 90) -> str:
    """Counter samples: +per_minute each minute for ``minutes``, then flat for ``idle``."""
    top = per_minute * minutes
    return f"0+{per_minute:g}x{minutes} {top:g}+0x{idle}"


# Two replicas, registries a (1 shortlist/s, mean K 3, 0.5 feedback/s) and b (2/s); traffic
# stops at 60m, so 5m windows are idle from 65m and 1h windows from 120m.
SERIES = [
    ('shortlist_requests_total{registry="a",policy="bor",instance="r1"}', _flat_after(30)),
    ('shortlist_requests_total{registry="a",policy="bor",instance="r2"}', _flat_after(30)),
    ('shortlist_requests_total{registry="b",policy="bor",instance="r1"}', _flat_after(120)),
    ('shortlist_k_sum{registry="a",instance="r1"}', _flat_after(180)),
    ('shortlist_k_count{registry="a",instance="r1"}', _flat_after(60)),
    ('shortlist_feedback_total{registry="a",instance="r1"}', _flat_after(30)),
    ('shortlist_feedback_total{registry="b",instance="r1"}', _flat_after(0)),
    ('shortlist_request_duration_seconds_bucket{stage="total",le="0.005",instance="r1"}', _flat_after(90)),
    ('shortlist_request_duration_seconds_bucket{stage="total",le="0.01",instance="r1"}', _flat_after(180)),
    ('shortlist_request_duration_seconds_bucket{stage="total",le="+Inf",instance="r1"}', _flat_after(180)),
]


P99 = "stage:shortlist_request_duration_seconds:p99_5m"  # a filtering `> 0` keeps the name
P50 = "stage:shortlist_request_duration_seconds:p50_5m"


def _case(expr: str, minute: int, samples: list[tuple[str, float]]) -> dict[str, Any]:
    return {
        "expr": expr,
        "eval_time": f"{minute}m",
        "exp_samples": [{"labels": labels, "value": value} for labels, value in samples],
    }


def _cases() -> list[dict[str, Any]]:
    shortlists = "Shortlists / s"
    mean_k = "Mean K"
    coverage = "Feedback coverage (1h)"
    p99 = "p99 latency, all registries (5m)"
    per_stage = "Latency per stage, all registries (p50, p99)"
    return [
        # "Shortlists / s" follows the registry variable (it ignored it: 3/s for any choice).
        _case(_expr(shortlists, registry="a"), 50, [("{}", 1.0)]),
        _case(_expr(shortlists, registry="b"), 50, [("{}", 2.0)]),
        _case(_expr(shortlists, registry="a|b"), 50, [("{}", 3.0)]),
        # Values while traffic flows.
        _case(_expr(mean_k), 50, [('{registry="a"}', 3.0)]),
        _case(_expr(coverage, registry="a"), 59, [('{registry="a"}', 0.5)]),
        _case(_expr(p99), 50, [(P99 + '{stage="total"}', 0.009899999999999999)]),
        _case(_expr(per_stage, "B"), 50, [(P50 + '{stage="total"}', 0.005)]),
        # Idle: no sample (a gap), where the plain division / quantile gave NaN.
        _case(_expr(mean_k), 100, []),
        _case(_expr(p99), 100, []),
        _case(_expr(per_stage, "A"), 100, []),
        _case(_expr(per_stage, "B"), 100, []),
        _case(_expr(coverage), 140, []),
    ]


def _run(tmp_path: Path, cases: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    tests = {
        "rule_files": [str(RECORDING)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in SERIES],
                "promql_expr_test": cases,
            }
        ],
    }
    path = tmp_path / "dashboard_test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_dashboard_panels_against_promtool(tmp_path: Path) -> None:
    proc = _run(tmp_path, _cases())
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed")
def test_the_unguarded_expressions_give_nan_when_idle(tmp_path: Path) -> None:
    """The check above can fail: the expressions as they were return NaN samples when idle."""
    old_mean_k = (
        'sum by (registry) (rate(shortlist_k_sum{registry=~".*"}[5m])) '
        '/ sum by (registry) (rate(shortlist_k_count{registry=~".*"}[5m]))'
    )
    proc = _run(tmp_path, [_case(old_mean_k, 100, [])])
    assert proc.returncode != 0 and "NaN" in proc.stdout + proc.stderr


def test_live_panels_are_titled_by_what_they_plot() -> None:
    panels = _panels()
    for title, panel in panels.items():
        exprs = " ".join(t["expr"] for t in panel["targets"])
        plots_gauge = "shortlist_live_bor_bits" in exprs or "shortlist_presentation_rate{" in exprs
        if "live" in title.lower():
            assert plots_gauge, f"{title!r} is called live but plots {exprs}"
    gauges = " ".join(t["expr"] for p in panels.values() for t in p["targets"])
    # deploy/README.md says the dashboard shows both per-replica gauges.
    text = README.read_text()
    assert "shortlist_presentation_rate` and `shortlist_live_bor_bits" in text
    assert "shortlist_presentation_rate{" in gauges and "shortlist_live_bor_bits{" in gauges


def test_runbook_names_only_settings_that_exist() -> None:
    from service.settings import ServiceSettings

    text = README.read_text()
    assert "minimum K" not in text
    for name in set(re.findall(r"SHORTLIST_[A-Z0-9_]+", text)):
        assert name.removeprefix("SHORTLIST_").lower() in ServiceSettings.model_fields, name
