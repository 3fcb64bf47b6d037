"""Train the BoR depth policy: DQN with exhaustive replay, plus its evaluation.

Each episode of the depth MDP (:mod:`registry.offline.env`) is a deterministic finite chain,
so the replay buffer simply holds every transition of every training episode: for each
state ``s_k`` a STOP transition (terminal reward) and, below the depth cap, a CONTINUE
transition ``(s_k, CONTINUE, -step_cost, s_{k+1})``. Minibatches are drawn uniformly from
that buffer; targets use a periodically synced target network with the Double-DQN rule
(the online net picks the next action among the valid ones, the target net values it),
a Huber loss and Adam with cosine learning-rate decay.

The Q-network is a small ReLU MLP. A clamp of every feature to the range it spanned in
training, input standardisation (training mean/std) and a clamp to +-``INPUT_CLIP`` standard
deviations live inside the network, so the exported ONNX takes raw
:func:`~registry.serving.features.depth_features` rows. The range clamp is a safety net for a
registry unlike the training data: a registry of 100,000 tools is read as one of the largest
training size instead of being extrapolated (which made a policy trained on registries of a
few hundred tools stop at depth 1 on a registry of 2,479; docs/results.md). Small registries
must not depend on it: ``--carve-per-query`` adds sub-registries of 5-200 tools
(:mod:`registry.offline.carve`) so the training range covers N = 5..2,479.

CLI::

    python -m registry.offline.train --episodes a.npz b.npz --holdout-fraction 0.3 --seed 0 --out models/

This module and :mod:`registry.offline.export` are the only depth modules importing torch.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from registry.fsio import json_safe
from registry.index.embed import sha256_file
from registry.offline.carve import ANCHOR_SIZES, FILL_KINDS, SIZE_RANGE, carve_training, load_source
from registry.offline.cli_support import HelpFormatter, ProgressEmbedder, plain, progress_step
from registry.offline.env import (
    DEFAULT_GAMMA,
    DEFAULT_MAX_DEPTH,
    DEFAULT_STEP_COST,
    REWARD_FUNCTIONS,
    Featurize,
    NeedsReward,
    RewardFn,
    bor_reward_floor,
    build_replay,
)
from registry.offline.episodes import Episode, load_episodes
from registry.offline.metrics import (
    DEFAULT_SCORER,
    compare_with_fixed,
    evaluate_policy,
    fixed_k_baselines,
)
from registry.offline.model import QEnsemble, QNetwork, SizeGatedQ, TrainedPolicy
from registry.offline.tables import candidate_episodes, load_or_build_table, rank_table
from registry.request import SCORERS
from registry.settings import EMBEDDERS

log = logging.getLogger(__name__)

__all__ = [
    "QEnsemble",
    "QNetwork",
    "SizeGatedQ",
    "TrainedPolicy",
    "compare_with_fixed",
    "data_episodes",
    "evaluate_policy",
    "fixed_k_baselines",
    "holdout_rows",
    "main",
    "split_episodes",
    "train_dqn",
    "train_ensemble",
]



def _feature_stats(states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mean = states.mean(axis=0)
    std = states.std(axis=0)
    # a feature constant in training (e.g. log2 N of a single registry) is centred, not scaled
    std = np.where(std > 1e-6, std, 1.0)
    return mean.astype(np.float32), std.astype(np.float32)


def train_dqn(
    episodes: Sequence[Episode],
    *,
    reward: str | RewardFn = "bor",
    reward_min_n: int = 1,
    step_cost: float = DEFAULT_STEP_COST,
    gamma: float = DEFAULT_GAMMA,
    max_depth: int = DEFAULT_MAX_DEPTH,
    seed: int = 0,
    steps: int = 4000,
    batch_size: int = 512,
    hidden: Sequence[int] = (32, 32),
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    target_sync_every: int = 100,
    huber_delta: float | None = None,
    log_every: int = 0,
    progress: bool = False,
    featurize: Featurize | None = None,
) -> TrainedPolicy:
    """Train a DQN depth policy with exhaustive replay. Deterministic given ``seed``.

    Args:
        episodes: training episodes.
        reward: ``"bor"`` (paper), ``"f1"`` (ablation) or a :data:`~registry.offline.env.RewardFn`.
        reward_min_n: with ``"bor"``, floor the registry size of the reward at this many tools
            (:func:`~registry.offline.env.bor_reward_floor`; 1: plain BoR).
        step_cost: cost of each CONTINUE.
        gamma: discount factor.
        max_depth: depth cap ``D`` of the MDP (and of the policy at inference).
        seed: seeds weight initialisation and minibatch sampling.
        steps: gradient steps.
        batch_size: states per minibatch (each contributes its STOP and CONTINUE transition).
        hidden: widths of the hidden ReLU layers. Defaults (32x32, 4000 steps) were picked on
            held-out BFCL/MetaTool/ToolBench dense episodes; larger nets or longer training
            overfit the few hundred training queries and lose found rate at equal depth.
        lr: Adam learning rate (cosine-decayed to 5% over ``steps``).
        weight_decay: Adam L2 penalty.
        target_sync_every: steps between target-network syncs.
        huber_delta: Huber loss threshold in reward units (bits for ``"bor"``); default: the
            largest terminal reward in the buffer. Keep it large: rewards are 0-or-R draws and
            Q must be their MEAN; in its linear region Huber regresses to the median instead
            (a delta of 1 bit makes every state with P(found) > 0.5 look certain).
        log_every: print the loss to stderr every this many steps (0: silent).
        progress: show a tqdm bar over the gradient steps.
        featurize: state features of an episode (default: schema-1 ``depth_features``; the
            needs-aware policy passes :func:`registry.serving.needs.needs_features`).

    Returns:
        The trained policy; ``history`` holds the loss every 100 steps.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError("steps and batch_size must be >= 1")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    reward_name = reward if isinstance(reward, str) else getattr(reward, "__name__", "custom")
    resolved: str | RewardFn | NeedsReward = reward
    if reward == "bor" and reward_min_n > 1:
        resolved = bor_reward_floor(reward_min_n)
    elif reward == "needs":
        resolved = NeedsReward(reward_min_n)
    replay = build_replay(episodes, reward=resolved, max_depth=max_depth, featurize=featurize)
    mean, std = _feature_stats(replay.states)

    states = torch.from_numpy(replay.states)
    r_stop = torch.from_numpy(replay.stop_reward)
    has_next = torch.from_numpy(replay.has_next)
    next_is_cap = torch.from_numpy(replay.next_is_cap)
    n_states = replay.n_states
    next_index = torch.clamp(torch.arange(n_states) + 1, max=n_states - 1)

    online = QNetwork(
        states.shape[1], hidden, mean, std, low=replay.states.min(axis=0), high=replay.states.max(axis=0)
    )
    target = copy.deepcopy(online)
    target.eval()
    opt = torch.optim.Adam(online.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: 0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * min(t, steps) / steps))
    )
    if huber_delta is None:
        huber_delta = max(1.0, float(replay.stop_reward.max()))
    huber = nn.HuberLoss(reduction="sum", delta=huber_delta)
    history: list[dict[str, float]] = []
    running = 0.0
    t0 = time.perf_counter()
    step_iter: Any = range(1, steps + 1)
    if progress:
        from tqdm import tqdm

        step_iter = tqdm(step_iter, desc=f"DQN seed {seed}", unit="step", file=sys.stderr, mininterval=1.0)
    for step in step_iter:
        idx = torch.randint(n_states, (batch_size,), generator=gen)
        q = online(states[idx])
        cont = has_next[idx]
        with torch.no_grad():
            nxt = states[next_index[idx]]
            q_next_online = online(nxt)
            # Double DQN: the online net picks among the next state's valid actions
            q_next_online[:, 1] = torch.where(
                next_is_cap[idx], torch.full_like(q_next_online[:, 1], -torch.inf), q_next_online[:, 1]
            )
            best = q_next_online.argmax(dim=1, keepdim=True)
            v_next = target(nxt).gather(1, best).squeeze(1)
            y_cont = -step_cost + gamma * v_next
        loss = huber(q[:, 0], r_stop[idx]) + huber(q[cont, 1], y_cont[cont])
        loss = loss / (batch_size + int(cont.sum()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running += float(loss.detach())
        if step % target_sync_every == 0:
            target.load_state_dict(online.state_dict())
        if step % 100 == 0:
            history.append({"step": float(step), "loss": running / 100})
            if log_every and step % log_every == 0 and not progress:
                print(
                    f"step {step:6d}  loss {running / 100:.4f}  {time.perf_counter() - t0:.1f}s",
                    file=sys.stderr,
                )
            running = 0.0
    online.eval()
    config = {
        "reward": reward_name,
        "reward_min_n": reward_min_n,
        "step_cost": step_cost,
        "gamma": gamma,
        "max_depth": max_depth,
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "hidden": list(hidden),
        "lr": lr,
        "weight_decay": weight_decay,
        "target_sync_every": target_sync_every,
        "huber_delta": huber_delta,
        "n_episodes": len(episodes),
        "n_states": n_states,
        "train_seconds": round(time.perf_counter() - t0, 2),
    }
    return TrainedPolicy(network=online, config=config, history=history)


def train_ensemble(episodes: Sequence[Episode], seeds: Sequence[int], **kwargs: Any) -> TrainedPolicy:
    """:func:`train_dqn` once per seed; several seeds are averaged into one :class:`QEnsemble`.

    ``kwargs`` go to :func:`train_dqn` (``seed`` excluded). The config records the seeds.
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("no seeds")
    kwargs.setdefault("progress", kwargs.pop("log_every", 0) > 0)
    runs = [train_dqn(episodes, seed=s, **kwargs) for s in seeds]
    if len(runs) == 1:
        return runs[0]
    config = dict(runs[0].config, seed=seeds[0], seeds=seeds, ensemble=len(seeds))
    config["train_seconds"] = round(sum(r.config["train_seconds"] for r in runs), 2)
    return TrainedPolicy(
        network=QEnsemble([r.network for r in runs]), config=config, history=runs[0].history
    )


# ----------------------------------------------------------------------------- evaluation


def split_episodes(
    episodes: Sequence[Episode], holdout_fraction: float, seed: int
) -> tuple[list[Episode], list[Episode]]:
    """Random ``(train, holdout)`` split, deterministic given ``seed``."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    order = np.random.default_rng(seed).permutation(len(episodes))
    n_hold = round(holdout_fraction * len(episodes))
    hold = sorted(order[:n_hold].tolist())
    train = sorted(order[n_hold:].tolist())
    return [episodes[i] for i in train], [episodes[i] for i in hold]


def holdout_rows(table: Any, holdout_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """``(train, holdout)`` query rows of a score table (queries with a gold tool only), the
    split ``shortlist train --data`` uses (benchmarks reuse it to evaluate held-out queries)."""
    keep = [i for i in range(table.n_queries) if table.gold[i].size]
    order = np.random.default_rng(seed).permutation(len(keep))
    n_hold = round(holdout_fraction * len(keep))
    return sorted(keep[j] for j in order[n_hold:]), sorted(keep[j] for j in order[:n_hold])


# ----------------------------------------------------------------------------- CLI


def _load_episode_files(
    paths: Sequence[Path], holdout_fraction: float, seed: int
) -> tuple[list[Episode], dict[str, list[Episode]], list[Episode], list[dict[str, Any]], set[str]]:
    train_eps: list[Episode] = []
    hold_by_set: dict[str, list[Episode]] = {}
    all_eps: list[Episode] = []
    files_info = []
    scorers: set[str] = set()
    for path in paths:
        eps, meta = load_episodes(path)
        eps = [e for e in eps if e.n_gold > 0]
        tr, ho = split_episodes(eps, holdout_fraction, seed)
        train_eps += tr
        all_eps += eps
        hold_by_set[path.stem] = ho
        if "scorer" in meta:
            scorers.add(str(meta["scorer"]))
        files_info.append(
            {"path": str(path), "sha256": sha256_file(path), "n_episodes": len(eps), "meta": meta}
        )
    return train_eps, hold_by_set, all_eps, files_info, scorers


def _parse_sizes(values: Sequence[str]) -> list[int | str]:
    out: list[int | str] = []
    for v in values:
        if v == "full":
            out.append("full")
        else:
            n = int(v)
            if n < 2:
                raise SystemExit(f"--candidate-sizes: {v!r} is not 'full' or an integer >= 2")
            out.append(n)
    return out


def data_episodes(
    tables: Sequence[Any],
    rows: Sequence[Sequence[int]],
    scorer: str,
    sizes: Sequence[int | str],
    *,
    hard_fraction: float = 0.25,
    seed: int = 0,
) -> list[Episode]:
    """Training episodes from score tables: for each candidate-set size, each query once.

    ``"full"`` ranks over the whole registry; an integer ``n`` builds the paper's candidate
    set (gold + ``round(hard_fraction * n)`` hard distractors + random fill; see
    :func:`registry.offline.tables.candidate_episodes`). Sizes at or above a registry's size
    collapse to ``"full"`` (once). Varying ``n`` varies ``log2 N`` and the score
    distribution below the head, which is what a registry-agnostic policy must learn from.
    """

    out: list[Episode] = []
    for table, r in zip(tables, rows):
        done_full = False
        for i, size in enumerate(sizes):
            if size == "full" or int(size) >= table.n_tools:
                if not done_full:
                    out += rank_table(table, scorer, rows=r).exact
                    done_full = True
                continue
            n = int(size)
            out += candidate_episodes(
                table, scorer, n, n_hard=round(hard_fraction * n), seed=seed * 1000 + i, rows=r
            ).exact
    return [e for e in out if e.n_gold > 0]


def main(argv: Sequence[str] | None = None) -> int:
    """Train a DQN depth policy, report held-out metrics, export ``policy.onnx`` + manifest.

    Training data is either labelled data directories (``--data``: ranked here under
    ``--scorer``) or episode files from ``shortlist episodes`` (``--episodes``). A
    ``--holdout-fraction`` of each set's queries is held out and evaluated over the full
    registry (found rate, mean K, BoR, depth efficiency against fixed K).
    """
    ap = argparse.ArgumentParser(
        prog="shortlist train", description=plain(main.__doc__), formatter_class=HelpFormatter
    )
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", nargs="+", type=Path, help="data directories (tools.json + queries.jsonl)")
    source.add_argument("--episodes", nargs="+", type=Path, help="episode .npz files (shortlist episodes)")
    ap.add_argument(
        "--scorer", default=None, choices=SCORERS,
        help="scorer ranking --data (default hybrid, the service default); with --episodes only the "
        "name recorded in the manifest (default: from the episode files)",
    )
    ap.add_argument(
        "--max-queries", type=int, default=None, help="--data: sample this many queries per set (default: all)"
    )
    ap.add_argument(
        "--candidate-sizes", nargs="+", default=["full"],
        help="--data: train on candidate sets of these sizes (integers and/or 'full'), e.g. "
        "20 50 100 200 500 1000 full",
    )
    ap.add_argument("--hard-fraction", type=float, default=0.25, help="share of hard distractors in a candidate set")
    ap.add_argument(
        "--carve-per-query", type=int, default=0,
        help="--data: also train on this many sub-registries per query (registry/offline/carve.py: gold + "
        "random / same-group / nearest-neighbour fill, BM25 recomputed on the sub-corpus)",
    )
    ap.add_argument(
        "--carve-sizes", type=int, nargs="+", default=list(ANCHOR_SIZES),
        help="sizes of a query's first carves; further carves draw N log-uniformly from --carve-range",
    )
    ap.add_argument(
        "--carve-range", type=int, nargs=2, default=list(SIZE_RANGE), metavar=("LO", "HI"),
        help="sizes of further carves are drawn log-uniformly from [LO, HI]",
    )
    ap.add_argument(
        "--size-gate", type=int, nargs=2, default=None, metavar=("N_LO", "N_HI"),
        help="with --carve-per-query: also train a large-registry expert on the full registries alone "
        "(plain BoR reward) and serve it from N_HI tools on, the carved-trained expert up to N_LO, "
        "blended between (SizeGatedQ; default: no gate)",
    )
    ap.add_argument("--embedder-cache", type=Path, default=None, help="MiniLM ONNX cache (default: the service's)")
    ap.add_argument(
        "--embedder", choices=EMBEDDERS, default=None,
        help="embedder whose scores the policy learns (default: SHORTLIST_EMBEDDER, else tuned); "
        "serve the policy with the same one",
    )
    ap.add_argument("--table-cache", type=Path, default=None, help="cache score tables here (default: no cache)")
    ap.add_argument("--holdout-fraction", type=float, default=0.3, help="share of each data set's queries held out for the reported metrics")
    ap.add_argument("--seed", type=int, default=0, help="seeds the split, sampling and training")
    ap.add_argument("--ensemble", type=int, default=1, help="average the Q-values of this many seeds (seed, seed+1, ...)")
    ap.add_argument("--out", type=Path, default=None, help="export directory (omit: no export)")
    ap.add_argument(
        "--reward", choices=sorted(REWARD_FUNCTIONS), default="bor",
        help="terminal reward: bor (Bits-over-Random, the paper's) or an ablation",
    )
    ap.add_argument(
        "--reward-min-n", type=int, default=1,
        help="bor: price depth as on a registry of at least this many tools (registry.offline.env."
        "bor_reward_floor; matters for carved sub-registries only)",
    )
    ap.add_argument("--step-cost", type=float, default=DEFAULT_STEP_COST, help="cost of each CONTINUE (bits)")
    ap.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, help="discount factor")
    ap.add_argument("--max-depth", type=int, default=DEFAULT_MAX_DEPTH, help="depth cap D of the MDP and the policy")
    ap.add_argument("--eval-cap", type=int, default=None, help="max_k for held-out metrics (default --max-depth)")
    ap.add_argument("--steps", type=int, default=4000, help="gradient steps per seed")
    ap.add_argument("--batch-size", type=int, default=512, help="states per minibatch")
    ap.add_argument("--hidden", type=int, nargs="+", default=[32, 32], help="hidden layer widths")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (cosine-decayed)")
    ap.add_argument(
        "--refit-all",
        action="store_true",
        help="after reporting held-out metrics, retrain on all queries and export that policy",
    )
    args = ap.parse_args(argv)
    if args.ensemble < 1:
        raise SystemExit("--ensemble must be >= 1")
    # One thread: the nets are tiny, and float reductions then do not depend on the core count,
    # so a seed reproduces the same policy on any machine (DQN amplifies rounding differences).
    torch.set_num_threads(1)
    cap = args.eval_cap or args.max_depth

    files_info: list[dict[str, Any]] = []
    carve_train: list[Episode] = []
    carve_all: list[Episode] = []
    if args.episodes:
        train_eps, hold_by_set, all_eps, files_info, scorers = _load_episode_files(
            args.episodes, args.holdout_fraction, args.seed
        )
        scorer = args.scorer or (",".join(sorted(scorers)) if scorers else "unknown")
        sizes: list[int | str] = ["full"]
    else:

        scorer = args.scorer or DEFAULT_SCORER
        sizes = _parse_sizes(args.candidate_sizes)
        embedder = None
        if scorer != "bm25":
            from registry.index.minilm_export import default_embedder
            from registry.settings import Settings

            chosen = {"embedder": args.embedder, "embedder_cache_dir": args.embedder_cache}
            settings = Settings(**{k: v for k, v in chosen.items() if v is not None})
            with progress_step(log, f"loading the {settings.embedder} embedder (exported to ONNX on first use)"):
                embedder = ProgressEmbedder(default_embedder(settings), log)
        tables = []
        train_rows, hold_rows, all_rows = [], [], []
        for directory in _progress(args.data, "scoring data sets"):
            table = load_or_build_table(
                directory, embedder, cache_dir=args.table_cache, max_queries=args.max_queries,
                seed=args.seed, progress=True,
            )
            tr_rows, ho_rows = holdout_rows(table, args.holdout_fraction, args.seed)
            tables.append(table)
            hold_rows.append(ho_rows)
            train_rows.append(tr_rows)
            all_rows.append(sorted(tr_rows + ho_rows))
            files_info.append({"path": str(directory), "n_queries": len(all_rows[-1]), "meta": table.meta})
            if args.carve_per_query > 0:
                if scorer != "hybrid":
                    raise SystemExit("--carve-per-query needs --scorer hybrid")
                src = load_source(table, embedder, cache_dir=args.table_cache, seed=args.seed)
                carve = {"seed": args.seed, "anchors": args.carve_sizes, "size_range": tuple(args.carve_range)}
                with progress_step(log, f"carving sub-registries of {directory.name}"):
                    carve_train += carve_training(src, tr_rows, args.carve_per_query, **carve)
                    if args.refit_all:
                        carve_all += carve_training(src, all_rows[-1], args.carve_per_query, **carve)
        with progress_step(log, "building training episodes"):
            train_eps = data_episodes(
                tables, train_rows, scorer, sizes, hard_fraction=args.hard_fraction, seed=args.seed
            )
            all_eps = data_episodes(
                tables, all_rows, scorer, sizes, hard_fraction=args.hard_fraction, seed=args.seed
            )
        train_eps += carve_train
        all_eps += carve_all
        hold_by_set = {
            t.name: rank_table(t, scorer, rows=r).exact for t, r in zip(tables, hold_rows) if r
        }

    hp = dict(
        reward=args.reward,
        reward_min_n=args.reward_min_n,
        step_cost=args.step_cost,
        gamma=args.gamma,
        max_depth=args.max_depth,
        steps=args.steps,
        batch_size=args.batch_size,
        hidden=tuple(args.hidden),
        lr=args.lr,
    )
    seeds = list(range(args.seed, args.seed + args.ensemble))
    if args.size_gate and args.carve_per_query <= 0:
        raise SystemExit("--size-gate needs --carve-per-query")

    def fit(eps: list[Episode], n_carved: int, **log: Any) -> TrainedPolicy:
        small = train_ensemble(eps, seeds, **log, **hp)
        if not args.size_gate:
            return small
        large = train_ensemble(eps[: len(eps) - n_carved], seeds, **log, **{**hp, "reward_min_n": 1})
        config = dict(small.config, size_gate=list(args.size_gate), large_expert=large.config)
        return TrainedPolicy(network=SizeGatedQ(small.network, large.network, *args.size_gate), config=config)

    trained = fit(train_eps, len(carve_train), log_every=1000)
    metrics: dict[str, Any] = {}
    hold_all: list[Episode] = []
    with progress_step(log, "held-out metrics"):
        for stem, ho in hold_by_set.items():
            if ho:
                metrics[stem] = compare_with_fixed(trained.choose_depth, ho, cap)
                hold_all += ho
        if hold_all and len(hold_by_set) > 1:
            metrics["all"] = compare_with_fixed(trained.choose_depth, hold_all, cap)
    metrics = {
        "holdout": json_safe(metrics, 6),
        "eval_cap": cap,
        "trained_on": "all" if args.refit_all or args.holdout_fraction == 0 else "train_split",
    }
    print(json.dumps(metrics, indent=2))

    if args.out is not None:
        from registry.offline.export import export_onnx

        if args.refit_all:
            log.info("refitting on all %d episodes", len(all_eps))
            trained = fit(all_eps, len(carve_all), log_every=1000)
        training_data = {
            "files": files_info,
            "scorer": scorer,
            "candidate_sizes": sizes,
            "hard_fraction": args.hard_fraction if sizes != ["full"] else None,
            "carved": (
                {"per_query": args.carve_per_query, "anchor_sizes": args.carve_sizes,
                 "size_range": args.carve_range, "fills": list(FILL_KINDS),
                 "n_episodes": len(carve_all if args.refit_all else carve_train)}
                if args.carve_per_query > 0 and not args.episodes else None
            ),
            "holdout_fraction": args.holdout_fraction,
            "n_train": len(all_eps) if args.refit_all else len(train_eps),
            "n_holdout": len(hold_all),
            "hyperparameters": trained.config,
        }
        path = export_onnx(
            trained, args.out, training_data=training_data, metrics=metrics, seed=args.seed, scorer=scorer
        )
        print(f"exported {path}", file=sys.stderr)
    return 0


def _progress(items: Sequence[Any], desc: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm ships with the train extra
        return items
    return tqdm(items, desc=desc, unit="set", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
