"""The training corpus (many public tool-retrieval sets) and its leave-one-source-out folds.

A *source* is one data directory in the common format (``tools.json``, ``queries.jsonl``; see
:mod:`registry.offline.datasets`): the public training sets under ``<root>/train/*`` and the dev sets
:data:`DEV_SOURCES` under ``<root>``. Every source is its own registry: a query is only ranked
against the tools of its source, and those tools are its hard negatives in training.

Generality is measured leave-one-source-out (LOSO): a model is judged on a source it never saw.
Training one model per source is too slow for a fine-tune on CPU, so :func:`loso_folds` groups
the sources into a few folds (each held-out group is tested by a model trained on the rest);
``n_folds = len(sources)`` is plain LOSO.

The tool text is :meth:`registry.tools.Tool.text` (:func:`registry.tool_text.tool_text`: name, its
words split from snake_case / camelCase / dotted / slashed forms, description, parameter names
and descriptions): the one text the dense index, BM25 and training all see.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from registry.offline.datasets import Dataset, LabelledQuery, load_dataset
from registry.tools import Tool

__all__ = [
    "DEFAULT_DATA_ROOT",
    "DEV_SOURCES",
    "MCP_SOURCE",
    "Fold",
    "cap_registry",
    "corpus_dirs",
    "load_corpus",
    "loso_folds",
    "subsample",
    "tool_texts",
    "training_pairs",
]

DEV_SOURCES: tuple[str, ...] = ("bfcl_simple", "metatool", "toolbench_stable")
TRAIN_SUBDIR = "train"
DEFAULT_DATA_ROOT = Path("../shared/data")
# The project's own hand-labelled tasks on real MCP servers' tools/list, in the common format
# (written by bench/mcp/corpus_source.py): one more source beside the public ones.
MCP_SOURCE = Path(__file__).resolve().parents[2] / "bench" / "data" / "mcp_servers"
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Fold:
    """One LOSO fold: a model trained on ``train`` sources is evaluated on ``test`` sources."""

    test: tuple[str, ...]
    train: tuple[str, ...]


def corpus_dirs(root: Path, extra: Sequence[Path] = ()) -> list[Path]:
    """The source directories under ``root``: ``train/*`` (sorted), the dev sets, then ``extra``.

    A directory under ``root`` counts when it holds both ``tools.json`` and ``queries.jsonl``;
    each ``extra`` directory must hold both.

    Raises:
        FileNotFoundError: ``root`` holds no source at all, or an ``extra`` directory is not one.
    """
    root = Path(root)
    candidates = sorted(p for p in (root / TRAIN_SUBDIR).glob("*") if p.is_dir())
    candidates += [root / name for name in DEV_SOURCES]
    found = [p for p in candidates if _is_source(p)]
    for directory in map(Path, extra):
        if not _is_source(directory):
            raise FileNotFoundError(f"{directory} is not a data set (no tools.json and queries.jsonl)")
        found.append(directory)
    if not found:
        raise FileNotFoundError(
            f"no data sets under {root} (expected {root}/{TRAIN_SUBDIR}/<set>/ and "
            f"{', '.join(DEV_SOURCES)} with tools.json and queries.jsonl)"
        )
    return found


def _is_source(directory: Path) -> bool:
    return (directory / "tools.json").is_file() and (directory / "queries.jsonl").is_file()


def subsample(items: Sequence[_T], limit: int | None, seed: int) -> list[_T]:
    """At most ``limit`` items drawn without replacement (seeded), in their original order."""
    if limit is None or len(items) <= limit:
        return list(items)
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def load_corpus(
    root: Path,
    *,
    max_queries: int | None = None,
    max_tools: int | None = None,
    seed: int = 0,
    only: Sequence[str] | None = None,
    extra: Sequence[Path] = (),
) -> list[Dataset]:
    """Load every source under ``root`` and ``extra`` (see :func:`corpus_dirs`), one :class:`Dataset` each.

    Args:
        root: The data root (``train/`` and the dev sets).
        max_queries: Per source, keep at most this many queries (seeded subsample); a large
            source (MetaTool: 20k queries over 199 tools) would otherwise dominate.
        max_tools: Per source, keep at most this many tools: every gold tool of the kept
            queries, then a seeded draw of the others (fewer distractors: an easier registry,
            the same one for every model compared).
        seed: Subsampling seed.
        only: Load just these source names.
        extra: More source directories (e.g. :data:`MCP_SOURCE`).
    """
    out = []
    for directory in corpus_dirs(root, extra):
        if only is not None and directory.name not in only:
            continue
        data = load_dataset(directory)
        queries = subsample(data.queries, max_queries, seed)
        out.append(Dataset(data.name, cap_registry(data.tools, queries, max_tools, seed), queries))
    return out


def cap_registry(
    tools: Sequence[Tool], queries: Sequence[LabelledQuery], limit: int | None, seed: int
) -> list[Tool]:
    """At most ``limit`` tools (original order): all gold tools of ``queries``, then a seeded draw."""
    if limit is None or len(tools) <= limit:
        return list(tools)
    needed = {g for q in queries for g in q.gold}
    others = [i for i, t in enumerate(tools) if t.name not in needed]
    keep = {i for i, t in enumerate(tools) if t.name in needed}
    keep.update(random.Random(seed).sample(others, max(0, min(len(others), limit - len(keep)))))
    return [tools[i] for i in sorted(keep)]


def loso_folds(sizes: dict[str, int], n_folds: int | None = None) -> list[Fold]:
    """Group sources into ``n_folds`` held-out groups of similar total size.

    Sources go largest first to the lightest group (ties: the earlier group), so the grouping
    is deterministic for the same ``sizes``. ``n_folds=None`` or ``>= len(sizes)`` gives one
    fold per source (plain LOSO).

    Args:
        sizes: Source name -> its weight (e.g. query count).
        n_folds: Number of folds.

    Raises:
        ValueError: Fewer than two sources, or ``n_folds < 2``.
    """
    names = list(sizes)
    if len(names) < 2:
        raise ValueError(f"LOSO needs at least two sources, got {names}")
    if n_folds is None or n_folds >= len(names):
        n_folds = len(names)
    if n_folds < 2:
        raise ValueError(f"n_folds must be >= 2, got {n_folds}")
    groups: list[list[str]] = [[] for _ in range(n_folds)]
    load = [0] * n_folds
    for name in sorted(names, key=lambda n: (-sizes[n], n)):
        lightest = min(range(n_folds), key=lambda g: (load[g], g))
        groups[lightest].append(name)
        load[lightest] += sizes[name]
    return [
        Fold(test=tuple(sorted(group)), train=tuple(n for n in names if n not in group))
        for group in groups
    ]


def tool_texts(tools: Sequence[Tool]) -> list[str]:
    """The index text of each tool (the one text dense, BM25 and training share)."""
    return [tool.text() for tool in tools]


def training_pairs(
    datasets: Sequence[Dataset], *, max_pairs: int | None = None, seed: int = 0
) -> list[tuple[str, str, str]]:
    """``(source, query, gold tool text)`` for every gold tool of every query, shuffled (seeded).

    ``max_pairs`` keeps a seeded random subset (for fine-tunes on a budget).
    """
    pairs: list[tuple[str, str, str]] = []
    for data in datasets:
        by_name = {tool.name: tool for tool in data.tools}
        for query in data.queries:
            pairs.extend((data.name, query.query, by_name[g].text()) for g in query.gold)
    random.Random(seed).shuffle(pairs)
    return pairs if max_pairs is None else pairs[:max_pairs]
