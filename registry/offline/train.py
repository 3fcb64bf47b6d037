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
few hundred tools stop at depth 1 on a registry of 2,479; docs/results/registry-size.md). Small registries
must not depend on it: ``--carve-per-query`` adds sub-registries of 5-200 tools
(:mod:`registry.offline.carve`) so the training range covers N = 5..2,479.

Its command line (``shortlist train``) is :mod:`registry.offline.train_cli`. This module and
:mod:`registry.offline.export` are the only depth modules importing torch.
"""

from __future__ import annotations

import copy
import logging
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from registry.offline.env import (
    DEFAULT_GAMMA,
    DEFAULT_MAX_DEPTH,
    DEFAULT_STEP_COST,
    Featurize,
    NeedsReward,
    RewardFn,
    bor_reward_floor,
    build_replay,
)
from registry.offline.episodes import Episode
from registry.offline.metrics import (
    compare_with_fixed,
    evaluate_policy,
    fixed_k_baselines,
)
from registry.offline.model import QEnsemble, QNetwork, SizeGatedQ, TrainedPolicy
from registry.offline.tables import candidate_episodes, rank_table

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
