"""WiSE-FT and score fusion between plain MiniLM and the shipped fine-tune, mix chosen under LOSO.

WiSE-FT (Wortsman et al. 2022) serves the weights ``base + a * delta`` (``delta`` is the shipped
``encoder-delta.safetensors``): ``a = 0`` is plain MiniLM, ``a = 1`` the shipped fine-tune, and
any ``a`` costs the same per query. Score fusion instead runs both encoders and adds
``(1 - w) * cos_plain + w * cos_tuned`` (two forward passes per query). Both are scored as the
service's hybrid (``+ 0.8 * bm25 / ceiling``) over the 16 sources (13 ``train/*`` + 3 dev sets).

Leave-one-source-out: for each source, the mix (``a`` or ``w``) with the best pooled found@1 on
the *other* 15 sources is applied to it; the baseline (hybrid plain MiniLM) is scored on the
same queries in the same run. Each model's vectors are cached under ``--workdir``, so a cut-short
run resumes::

    python bench/studies/ranker_mix.py --data ../shared/data --workdir data/ranker_mix \
        --max-queries 200 --max-tools 500 --json docs/generated/ranker_mix.json

Caveat printed with the table: the shipped fine-tune was trained on 13 of these 16 sources
(all but nestools, star and apipack), so only those three are unseen by the fine-tune itself;
LOSO here guards the choice of the mix, not the fine-tune's training data.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from registry.index.embed import TOKENIZER_FILE, OnnxEmbedder
from registry.index.embedders import load_minilm
from registry.index.hybrid import HYBRID_ALPHA
from registry.offline.corpus import DEFAULT_DATA_ROOT, load_corpus, tool_texts
from registry.offline.corpus_vectors import SourceVectors, bm25_matrix, corpus_vectors
from registry.offline.loso_report import MULTI_TOOL_SHARE
from registry.offline.ranking import SourceScore, pooled, score_ranks
from registry.serving.shorthand import expand_shorthand
from registry.settings import Settings

WISE_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
FUSION_GRID = (0.25, 0.5, 0.75)
UNSEEN_BY_FINETUNE = ("nestools", "star", "apipack")
# 40 newer hand-written tasks on the MCP servers the fine-tune saw 180 tasks of: unseen requests.
NEW_MCP_TASKS = Path(__file__).resolve().parents[1] / "data" / "mcp_servers_new_tasks"


def scaled_delta_dir(tuned_dir: Path, alpha: float, out: Path) -> Path:
    """An adapter directory whose delta is ``alpha`` times the shipped one (WiSE-FT weights)."""
    from safetensors.numpy import load_file, save_file

    from registry.index.embed import sha256_file

    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((tuned_dir / "manifest.json").read_text())
    delta = load_file(str(tuned_dir / manifest["file"]))
    scaled = {k: (v.astype(np.float32) * alpha).astype(np.float16) for k, v in delta.items()}
    save_file(scaled, str(out / "encoder-delta.safetensors"))
    manifest.update(
        file="encoder-delta.safetensors",
        sha256=sha256_file(out / "encoder-delta.safetensors"),
        model=f"{manifest['model']}@wise{alpha:g}",
    )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def wise_embedder(alpha: float, workdir: Path, settings: Settings, *, int8: bool = False) -> OnnxEmbedder:
    """The WiSE-FT encoder at ``alpha`` (0: plain MiniLM, 1: the shipped fine-tune)."""
    cache = settings.resolved_embedder_cache()
    if alpha == 0.0:
        return load_minilm(cache, threads=2, embedder="minilm-int8" if int8 else "minilm")
    if alpha == 1.0:
        return load_minilm(
            cache, threads=2, embedder="tuned-int8" if int8 else "tuned", adapter_dir=settings.tuned_embedder_dir
        )
    from registry.index.export_embedder import export_minilm_onnx, quantize_minilm_int8
    from registry.index.minilm_export import minilm_model_dir

    here = workdir / f"wise{alpha:g}"
    fp32 = here / "model.onnx"
    if not fp32.is_file():
        adapter = scaled_delta_dir(settings.tuned_embedder_dir, alpha, here / "adapter")
        export_minilm_onnx(minilm_model_dir(), fp32, adapter=adapter)
    path = fp32
    if int8:
        path = here / "model-int8.onnx"
        if not path.is_file():
            quantize_minilm_int8(fp32, path)
    return OnnxEmbedder(path, here / TOKENIZER_FILE, threads=2)


def gold_ranks(scores: np.ndarray, gold: tuple[tuple[int, ...], ...]) -> list[np.ndarray]:
    out = []
    for row, g in zip(scores, gold, strict=True):
        idx = np.array(g, dtype=np.int64)
        out.append((row[None, :] > row[idx][:, None]).sum(axis=1))
    return out


def score(name: str, scores: np.ndarray, gold: tuple[tuple[int, ...], ...]) -> SourceScore:
    return score_ranks(name, gold_ranks(scores, gold))


def cosine(sv: SourceVectors) -> np.ndarray:
    return sv.queries @ sv.tools.T


def with_shorthand(corpus: list, sv: list[SourceVectors], embedder: OnnxEmbedder) -> list[SourceVectors]:
    """``sv`` with every query that carries shorthand re-embedded and BM25-scored as the service
    now reads it (:func:`registry.serving.shorthand.expand_shorthand`)."""
    out = []
    for data, vectors in zip(corpus, sv, strict=True):
        texts = [q.query for q in data.queries]
        changed = [i for i, t in enumerate(texts) if expand_shorthand(t) != t]
        if not changed:
            out.append(vectors)
            continue
        expanded = [expand_shorthand(texts[i]) for i in changed]
        queries, bm25 = vectors.queries.copy(), vectors.bm25.copy()
        queries[changed] = embedder.embed_documents(expanded)
        bm25[changed] = bm25_matrix(tool_texts(data.tools), expanded)
        out.append(replace(vectors, queries=queries, bm25=bm25))
    return out


def candidates(models: dict[float, list[SourceVectors]]) -> dict[str, list[np.ndarray]]:
    """Every mix's hybrid score matrices, one per source: ``wise<a>`` and ``fuse<w>``."""
    out: dict[str, list[np.ndarray]] = {}
    plain, tuned = models[0.0], models[1.0]
    for a, svs in models.items():
        out[f"wise{a:g}"] = [sv.hybrid() for sv in svs]
    for w in FUSION_GRID:
        out[f"fuse{w:g}"] = [
            (1 - w) * cosine(p) + w * cosine(t) + HYBRID_ALPHA * p.bm25 for p, t in zip(plain, tuned, strict=True)
        ]
    return out


def loso(
    names: list[str], golds: list, table: dict[str, list[SourceScore]], family: str
) -> tuple[list[SourceScore], dict[str, str]]:
    """Per held-out source, the ``family`` mix with the best pooled found@1 on the other sources."""
    keys = [k for k in table if k.startswith(family)]
    chosen, scores = {}, []
    for i, name in enumerate(names):
        def train_found(key: str, held: int = i) -> float:
            return pooled([s for j, s in enumerate(table[key]) if j != held])["found_at_1"]

        best = max(keys, key=train_found)
        chosen[name] = best
        scores.append(table[best][i])
    return scores, chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_ROOT)
    parser.add_argument("--workdir", type=Path, default=Path("data/ranker_mix"))
    parser.add_argument("--max-queries", type=int, default=200)
    parser.add_argument("--max-tools", type=int, default=500)
    parser.add_argument("--alphas", type=float, nargs="*", default=list(WISE_GRID))
    parser.add_argument("--embed-only", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    def log(message: str) -> None:
        print(time.strftime("%H:%M:%S"), message, file=sys.stderr, flush=True)

    settings = Settings()
    corpus = load_corpus(args.data, max_queries=args.max_queries, max_tools=args.max_tools, extra=[NEW_MCP_TASKS])
    models: dict[float, list[SourceVectors]] = {}
    for a in args.alphas:
        log(f"embedding with WiSE-FT alpha {a:g}")
        models[a] = corpus_vectors(corpus, wise_embedder(a, args.workdir, settings), args.workdir / "vectors", log)
    if args.embed_only:
        return 0
    all_names = [ds.name for ds in corpus]
    mixes = candidates(models)
    if 1.0 in models:  # the shipped fine-tune as served now: shorthand spelled out
        expanded = with_shorthand(corpus, models[1.0], wise_embedder(1.0, args.workdir, settings))
        mixes["tuned+shorthand"] = [sv.hybrid() for sv in expanded]
    all_table = {
        key: [score(n, m, sv.gold) for n, m, sv in zip(all_names, mats, models[0.0], strict=True)]
        for key, mats in mixes.items()
    }
    keep = [i for i, n in enumerate(all_names) if n != NEW_MCP_TASKS.name]  # the 16 sources
    names = [all_names[i] for i in keep]
    golds = [models[0.0][i].gold for i in keep]
    table = {key: [scores[i] for i in keep] for key, scores in all_table.items()}
    multi_src = {sv.name for sv in models[0.0] if sv.multi_tool.mean() >= MULTI_TOOL_SHARE}
    base = table["wise0"]
    rows = {"plain (hybrid MiniLM)": base, "shipped fine-tune": table["wise1"]}
    chosen: dict[str, dict[str, str]] = {}
    for family in ("wise", "fuse"):
        rows[f"LOSO {family}"], chosen[family] = loso(names, golds, table, family)
    for key in table:
        rows[key] = table[key]
    report = summarise(rows, base, multi_src)
    print(format_report(report, names, chosen))
    unseen = [n for n in all_names if n in UNSEEN_BY_FINETUNE or n == NEW_MCP_TASKS.name]
    clean = clean_loso(all_names, all_table, unseen)
    print(format_clean(clean, unseen))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": report, "chosen": chosen, "unseen_loso": clean}, indent=2))
    return 0


def clean_loso(names: list[str], table: dict[str, list[SourceScore]], unseen: list[str]) -> dict:
    """LOSO over the sources the fine-tune never trained on: each one's mix is chosen on the others.

    On the 13 sources the shipped fine-tune trained on, any choice favours it (it has seen them),
    so this is the only choice of the mix that no trained-on data can sway.
    """
    at = {n: i for i, n in enumerate(names)}
    out: dict = {"per_source": {}}
    for family in ("wise", "fuse"):
        keys = [k for k in table if k.startswith(family)]
        picked = []
        for held in unseen:
            others = [at[n] for n in unseen if n != held]
            best = max(keys, key=lambda k: pooled([table[k][i] for i in others])["found_at_1"])
            picked.append(table[best][at[held]])
            out["per_source"].setdefault(held, {})[f"LOSO {family}"] = best
        out[f"LOSO {family}"] = 100 * pooled(picked)["found_at_1"]
    for key in table:
        out[key] = 100 * pooled([table[key][at[n]] for n in unseen])["found_at_1"]
        for n in unseen:
            out["per_source"][n][key] = 100 * table[key][at[n]].found_at_1
    return out


def format_clean(clean: dict, unseen: list[str]) -> str:
    keys = [k for k in clean if k not in ("per_source",) and not k.startswith("LOSO")]
    lines = ["", f"sources the fine-tune never trained on ({', '.join(unseen)}), found@1 pooled:",
             "| " + " | ".join(["LOSO wise", "LOSO fuse", *keys]) + " |", "|---" * (len(keys) + 2) + "|",
             "| " + " | ".join(f"{clean[k]:.1f}" for k in ["LOSO wise", "LOSO fuse", *keys]) + " |", "",
             "| source | " + " | ".join(keys) + " | picked (wise, fuse) |", "|---" * (len(keys) + 2) + "|"]
    for n in unseen:
        row = clean["per_source"][n]
        lines.append(f"| {n} | " + " | ".join(f"{row[k]:.1f}" for k in keys)
                     + f" | {row['LOSO wise']}, {row['LOSO fuse']} |")
    return "\n".join(lines)


def summarise(rows: dict[str, list[SourceScore]], base: list[SourceScore], multi_src: set[str]) -> dict:
    out = {}
    for label, scores in rows.items():
        multi = [s for s in scores if s.source in multi_src]
        base_multi = [s for s in base if s.source in multi_src]
        out[label] = {
            "found_at_1": 100 * pooled(scores)["found_at_1"],
            "delta_found_at_1": 100 * (pooled(scores)["found_at_1"] - pooled(base)["found_at_1"]),
            "recall_at_5_multi": 100 * pooled(multi)["recall_at_5_multi"],
            "delta_recall_at_5_multi": 100
            * (pooled(multi)["recall_at_5_multi"] - pooled(base_multi)["recall_at_5_multi"]),
            "per_source_delta_found_at_1": {
                s.source: 100 * (s.found_at_1 - b.found_at_1) for s, b in zip(scores, base, strict=True)
            },
            "per_source_found_at_1": {s.source: 100 * s.found_at_1 for s in scores},
            "per_source_recall_at_5_multi": {s.source: 100 * s.recall_at_5_multi for s in multi},
        }
    return out


def format_report(report: dict, names: list[str], chosen: dict[str, dict[str, str]]) -> str:
    lines = ["| ranking | found@1 pooled | vs plain | recall@5 multi | vs plain | worst source (found@1 vs plain) |",
             "|---|---|---|---|---|---|"]
    for label, r in report.items():
        worst = min(r["per_source_delta_found_at_1"].items(), key=lambda kv: kv[1])
        lines.append(
            f"| {label} | {r['found_at_1']:.1f} | {r['delta_found_at_1']:+.1f} | {r['recall_at_5_multi']:.1f} "
            f"| {r['delta_recall_at_5_multi']:+.1f} | {worst[0]} {worst[1]:+.1f} |"
        )
    lines += ["", "per source, found@1 vs plain:", "| source | " + " | ".join(report) + " |",
              "|---|" + "---|" * len(report)]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(f"{r['per_source_delta_found_at_1'][n]:+.1f}" for r in report.values()) + " |")
    lines += ["", f"mix chosen per held-out source: {json.dumps(chosen)}",
              f"unseen by the shipped fine-tune's training: {', '.join(UNSEEN_BY_FINETUNE)}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
