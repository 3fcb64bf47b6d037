"""The report of a depth-policy evaluation: Markdown tables, PNG figures, ``results.json``.

Renders what :func:`registry.offline.evaluate.evaluate_ranked` returns (one report per data
set and scorer): :func:`markdown_tables` (the policy table and the difficulty-bucket table),
:func:`plot_report` (``figure1_<set>.png``: depth and found per bucket; ``curve_<set>.png``:
found vs mean K against the fixed-K curve) and :func:`write_report`, which writes all three.
Reports written before a metric existed show "–" for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from registry.fsio import json_safe

__all__ = ["format_value", "markdown_tables", "plot_report", "write_report"]


def _pct(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def format_value(x: float | None, nd: int = 2) -> str:
    """``x`` with ``nd`` decimals; "–" for a missing value, "∞" for an infinite one."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "-∞"
    return f"{x:.{nd}f}"


def markdown_tables(reports: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown section per report: the policy table and the difficulty-bucket table.

    Found (any gold tool shown) and all found (every gold tool shown) sit side by side; reports
    written before "all" existed (no ``found_all`` keys) show "–" there.
    """
    out: list[str] = []
    for rep in reports:
        out.append(
            f"## {rep['dataset']} ({rep['scorer']}, N={rep['n_tools']}, {rep['n']} queries, cap {rep['cap']})\n"
        )
        fa = rep["found_at"]
        fall = rep.get("found_all_at", {})
        out.append(
            f"Scorer found@1/5/10: {_pct(fa['1'])} / {_pct(fa['5'])} / {_pct(fa['10'])}; every gold "
            f"tool found@1/5/10: {_pct(fall.get('1'))} / {_pct(fall.get('5'))} / {_pct(fall.get('10'))} "
            f"({rep.get('n_multi_gold', '–')} of {rep['n']} queries need >= 2 tools). "
            "Efficiency = K_eq / mean K, K_eq = fixed depth with the same found rate (interpolated); "
            "all-found efficiency uses the fixed all-found curve.\n"
        )
        out.append(
            "| policy | found % | found % (equiv.) | all found % | all found % (equiv.) | mean K | K std "
            "| distinct K | BoR bits | BoR all bits | K_eq | efficiency | all: fixed K at mean K % "
            "| all: efficiency |"
        )
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for p in rep["policies"]:
            out.append(
                f"| {p['policy']} | {_pct(p['found'])} | {_pct(p['found_equiv'])} | "
                f"{_pct(p.get('found_all'))} | {_pct(p.get('found_all_equiv'))} | {format_value(p['mean_k'])} | "
                f"{format_value(p['k_std'])} | {p['distinct_k']} | {format_value(p['bor_bits'])} | "
                f"{format_value(p.get('bor_bits_all'))} | {format_value(p['k_eq'])} | {format_value(p['efficiency'])} | "
                f"{_pct(p.get('fixed_found_all_at_mean_k'))} | {format_value(p.get('efficiency_all'))} |"
            )
        names = [b[0] for b in rep["buckets"]]
        counts = {b["bucket"]: b["n"] for b in rep["policies"][0]["buckets"]}
        out.append("")
        out.append("Per difficulty bucket (rank of the best gold tool): mean K / found % / all found %\n")
        out.append("| policy | " + " | ".join(f"{n} (n={counts[n]})" for n in names) + " |")
        out.append("|---|" + "---|" * len(names))
        for p in rep["policies"]:
            cells = [
                f"{format_value(b['mean_k'], 1)} / {_pct(b['found'])} / {_pct(b.get('found_all'))}"
                for b in p["buckets"]
            ]
            out.append(f"| {p['policy']} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text).strip("_")


def plot_report(
    rep: Mapping[str, Any],
    out_dir: Path,
    *,
    figure1_policies: Sequence[str] | None = None,
    slug: str | None = None,
) -> list[Path]:
    """Write ``figure1_<set>.png`` (K and found per bucket) and ``curve_<set>.png``.

    ``figure1_policies``: which policies the bucket figure shows (default: every non-fixed
    policy plus fixed K=1 and K=5, like the paper's Figure 1). ``slug`` names the files
    (default ``<dataset>_<scorer>``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    slug = _slug(slug or f"{rep['dataset']}_{rep['scorer']}")
    rows = rep["policies"]
    if figure1_policies is None:
        chosen = [p for p in rows if not p["policy"].startswith("fixed")]
        chosen += [p for p in rows if p["policy"] in ("fixed K=1", "fixed K=5")]
    else:
        chosen = [p for p in rows if p["policy"] in figure1_policies]
    names = [b[0] for b in rep["buckets"]]
    counts = [b["n"] for b in rows[0]["buckets"]]
    x = np.arange(len(names))
    width = 0.8 / max(1, len(chosen))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for j, p in enumerate(chosen):
        ks = [b["mean_k"] for b in p["buckets"]]
        fs = [100 * b["found"] if not math.isnan(b["found"]) else np.nan for b in p["buckets"]]
        axes[0].bar(x + (j - (len(chosen) - 1) / 2) * width, ks, width, label=p["policy"])
        axes[1].bar(x + (j - (len(chosen) - 1) / 2) * width, fs, width, label=p["policy"])
    labels = [f"{n}\n(n={c})" for n, c in zip(names, counts)]
    for ax, title in zip(axes, ("chosen K per bucket", "found % per bucket")):
        ax.set_xticks(x, labels)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("mean K")
    axes[1].set_ylabel("found %")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{rep['dataset']} ({rep['scorer']}, N={rep['n_tools']}): difficulty buckets")
    fig.tight_layout()
    fig1 = out_dir / f"figure1_{slug}.png"
    fig.savefig(fig1, dpi=110)
    plt.close(fig)

    curve = np.asarray(rep["fixed_curve"])
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    depths = np.arange(1, curve.size)
    ax.plot(depths, 100 * curve[1:], "-", color="0.4", label="fixed K (K = 1..cap)")
    if rep.get("n_multi_gold") and "fixed_curve_all" in rep:
        curve_all = np.asarray(rep["fixed_curve_all"])
        ax.plot(depths, 100 * curve_all[1:], "--", color="0.6", label="fixed K, every gold tool shown")
        for p in rows:
            if not p["policy"].startswith("fixed"):
                ax.plot(p["mean_k"], 100 * p["found_all"], "x", ms=8, label=f"{p['policy']} (all found)")
    for p in rows:
        if p["policy"].startswith("fixed"):
            ax.plot(p["mean_k"], 100 * p["found"], "o", color="0.4", ms=4)
            ax.annotate(p["policy"].replace("fixed ", ""), (p["mean_k"], 100 * p["found"]),
                        fontsize=7, xytext=(3, -9), textcoords="offset points", color="0.3")
        else:
            ax.plot(p["mean_k"], 100 * p["found"], "*", ms=11,
                    label=f"{p['policy']} (eff. {format_value(p['efficiency'])})")
    ax.set_xscale("log")
    ax.set_xlabel("mean K (tools shown, log scale)")
    ax.set_ylabel("found %")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"{rep['dataset']} ({rep['scorer']}, N={rep['n_tools']}): found vs mean K")
    fig.tight_layout()
    fig2 = out_dir / f"curve_{slug}.png"
    fig.savefig(fig2, dpi=110)
    plt.close(fig)
    return [fig1, fig2]


def write_report(
    reports: Sequence[Mapping[str, Any]],
    out_dir: Path | str,
    *,
    plots: bool = True,
    img_dir: Path | str | None = None,
) -> dict[str, Path]:
    """Write ``results.json``, ``results.md`` and (``plots``) the PNG figures.

    Figures go to ``img_dir`` (default ``out_dir``); ``results.md`` links them relatively.
    """
    import os

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    img = Path(img_dir) if img_dir is not None else out
    paths = {"json": out / "results.json", "markdown": out / "results.md"}
    paths["json"].write_text(json.dumps(json_safe(list(reports), 6), indent=2) + "\n", encoding="utf-8")
    md = "# Depth-policy evaluation\n\n" + markdown_tables(reports)
    if plots:
        for rep in reports:
            figs = plot_report(rep, img)
            for f in figs:
                paths[f.stem] = f
            md += "\n" + "\n".join(
                f"![{f.stem}]({Path(os.path.relpath(f, out)).as_posix()})" for f in figs
            ) + "\n"
    paths["markdown"].write_text(md, encoding="utf-8")
    return paths
