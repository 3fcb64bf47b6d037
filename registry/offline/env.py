"""The depth-selection MDP of "How Many Tools Should an LLM Agent See?" (section 3.2).

One episode is one query. The agent walks the ranked list: in state ``k`` (``k`` tools
shown, features = ``depth_features(...)[k-1]``) it either STOPs, presenting the top ``k``
tools, or CONTINUEs to ``k + 1``.

Rewards:
    * STOP at depth ``k``: if any relevant tool is among the top ``k`` (``min gold rank < k``)
      the terminal reward of the chosen reward function, else 0.

      - ``"bor"``: ``-log2 P_rand(N, R_q, k)`` bits, ``R_q`` = number of relevant tools
        (1 when an episode lists none; it then never succeeds anyway);
      - ``"f1"``: ``2 / (k + 1)``, the F1 of a hit with recall 1 and precision ``1/k``
        (the paper's ablation);
      - :func:`bor_reward_floor` ``(n_min)``: BoR with the registry size floored at ``n_min``,
        ``-log2 P_rand(max(N, n_min), R_q, k)``. Identical to ``"bor"`` on registries of
        ``n_min`` tools or more. On a registry of 8 tools pure BoR pays 3 bits for one tool and
        1.4 for three, so its optimum is one tool unless the top tool is right less than half
        as often as the top three: it answers 1 tool on nearly every query and finds no more
        than fixed K=1. The floor prices depth on a small registry as on a larger one (the
        value of a shortlist to an agent does not collapse because the server is small), so
        the policy still goes deeper when the scores are ambiguous.
      - :class:`NeedsReward` (``"needs"``): every needed tool counts, chance-corrected
        (:func:`registry.bor.needs_bits_curve`: half recall priced at ``-log2 P_rand(N, 1, k)``,
        half ``BoR_all`` per needed tool when all are shown), the registry size floored at
        ``n_min`` as above. Equal to ``"bor"`` on single-tool episodes.
    * CONTINUE: ``-step_cost``.

The depth cap is ``D = min(max_depth, len(scores), policy_depth_limit(n_tools))`` (half the
registry from 8 tools on, see :func:`registry.serving.depth_policies.policy_depth_limit`, the bound
serving applies): in state ``D`` only STOP is allowed. Returns are discounted by ``gamma``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from registry.bor import log_p_rand_curve, needs_bits_curve
from registry.offline.episodes import Episode
from registry.serving.depth_policies import policy_depth_limit
from registry.serving.features import depth_features

__all__ = [
    "CONTINUE",
    "REWARD_FUNCTIONS",
    "STOP",
    "DepthEnv",
    "Featurize",
    "NeedsReward",
    "Replay",
    "RewardFn",
    "bor_reward",
    "bor_reward_floor",
    "build_replay",
    "f1_reward",
    "get_reward_fn",
    "stop_rewards",
]

STOP = 0
CONTINUE = 1

DEFAULT_STEP_COST = 0.01
DEFAULT_GAMMA = 0.95
DEFAULT_MAX_DEPTH = 50

RewardFn = Callable[[np.ndarray, int, int], np.ndarray]
"""``reward(k, n_tools, n_gold) -> rewards``: terminal reward of a successful STOP at each depth ``k``."""

_LN2 = float(np.log(2.0))


def bor_reward(k: np.ndarray, n_tools: int, n_gold: int) -> np.ndarray:
    """``-log2 P_rand(N, R, k)`` per depth ``k >= 1`` (``R = max(n_gold, 1)``)."""
    k = np.asarray(k, dtype=np.int64)
    r = min(max(int(n_gold), 1), int(n_tools))
    curve = log_p_rand_curve(int(n_tools), r, int(k.max()) if k.size else 0)
    return -curve[k] / _LN2 + 0.0


def f1_reward(k: np.ndarray, n_tools: int, n_gold: int) -> np.ndarray:
    """``2 / (k + 1)``: F1 of a successful depth-``k`` shortlist with one relevant tool."""
    return 2.0 / (np.asarray(k, dtype=np.float64) + 1.0)


def bor_reward_floor(n_min: int) -> RewardFn:
    """BoR reward with the registry size floored at ``n_min`` (see the module docstring)."""
    if n_min < 1:
        raise ValueError(f"n_min must be >= 1, got {n_min}")

    def reward(k: np.ndarray, n_tools: int, n_gold: int) -> np.ndarray:
        return bor_reward(k, max(int(n_tools), int(n_min)), n_gold)

    reward.__name__ = f"bor_floor_{n_min}"
    return reward


@dataclass(frozen=True)
class NeedsReward:
    """The needs reward (module docstring); it reads every gold rank, not just the first."""

    n_min: int = 1

    def __post_init__(self) -> None:
        if self.n_min < 1:
            raise ValueError(f"n_min must be >= 1, got {self.n_min}")

    @property
    def __name__(self) -> str:
        return "needs" if self.n_min == 1 else f"needs_floor_{self.n_min}"

    def curve(self, episode: Episode, d: int) -> np.ndarray:
        """The reward of STOP at ``k = 1..d``."""
        if episode.n_gold == 0:
            return np.zeros(d, dtype=np.float64)
        n = max(episode.n_tools, self.n_min)
        hits = np.searchsorted(np.sort(episode.gold_ranks), np.arange(1, d + 1), side="left")
        return needs_bits_curve(n, min(episode.n_gold, n), hits)


REWARD_FUNCTIONS: dict[str, RewardFn] = {"bor": bor_reward, "f1": f1_reward}

Featurize = Callable[[Episode, int], np.ndarray]
"""``featurize(episode, depth) -> (depth, F)`` state features (default: schema-1 ``depth_features``)."""


def _schema1(episode: Episode, d: int) -> np.ndarray:
    return depth_features(episode.scores, episode.n_tools, d)


def get_reward_fn(reward: str | RewardFn) -> RewardFn:
    """Resolve a reward name (``"bor"`` | ``"f1"``) or pass a callable through."""
    if callable(reward):
        return reward
    try:
        return REWARD_FUNCTIONS[reward]
    except KeyError:
        raise ValueError(f"unknown reward {reward!r}; choose one of {sorted(REWARD_FUNCTIONS)}") from None


def depth_cap(episode: Episode, max_depth: int) -> int:
    """``D = min(max_depth, len(scores), policy_depth_limit(n_tools))``."""
    return min(int(max_depth), int(episode.scores.size), policy_depth_limit(episode.n_tools))


def stop_rewards(
    episode: Episode, *, reward: str | RewardFn | NeedsReward = "bor", max_depth: int = DEFAULT_MAX_DEPTH
) -> np.ndarray:
    """Reward of STOP at each depth ``k = 1..D`` (float64, length ``D``), success-gated."""
    d = depth_cap(episode, max_depth)
    if reward == "needs":
        reward = NeedsReward()
    if isinstance(reward, NeedsReward):
        return reward.curve(episode, d)
    k = np.arange(1, d + 1)
    success = k > episode.first_gold_rank
    out = np.zeros(d, dtype=np.float64)
    if success.any():
        out[success] = get_reward_fn(reward)(k[success], episode.n_tools, episode.n_gold)
    return out


class DepthEnv:
    """Step-by-step view of the MDP over one :class:`Episode` (tests, diagnostics).

    Training does not step this object; it uses :func:`build_replay`, which produces the same
    transitions in bulk.
    """

    def __init__(
        self,
        episode: Episode,
        *,
        reward: str | RewardFn = "bor",
        step_cost: float = DEFAULT_STEP_COST,
        gamma: float = DEFAULT_GAMMA,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.episode = episode
        self.step_cost = float(step_cost)
        self.gamma = float(gamma)
        self.cap = depth_cap(episode, max_depth)
        self.features = depth_features(episode.scores, episode.n_tools, self.cap)
        self.stop_rewards = stop_rewards(episode, reward=reward, max_depth=self.cap)
        self.k = 1
        self.done = False

    def reset(self) -> np.ndarray:
        """Start over at depth 1; returns the state features."""
        self.k = 1
        self.done = False
        return self.features[0]

    def valid_actions(self) -> tuple[int, ...]:
        return (STOP,) if self.k >= self.cap else (STOP, CONTINUE)

    def step(self, action: int) -> tuple[np.ndarray | None, float, bool]:
        """Apply ``action``; returns ``(next_state or None when done, reward, done)``.

        Raises:
            RuntimeError: the episode is over.
            ValueError: unknown action, or CONTINUE at the depth cap.
        """
        if self.done:
            raise RuntimeError("episode is over; call reset()")
        if action == STOP:
            self.done = True
            return None, float(self.stop_rewards[self.k - 1]), True
        if action != CONTINUE:
            raise ValueError(f"unknown action {action!r}")
        if self.k >= self.cap:
            raise ValueError(f"only STOP is allowed at the depth cap {self.cap}")
        self.k += 1
        return self.features[self.k - 1], -self.step_cost, False

    def returns(self) -> np.ndarray:
        """Discounted return of the plan "CONTINUE until ``k``, then STOP", for ``k = 1..D``."""
        k = np.arange(1, self.cap + 1, dtype=np.float64)
        g = self.gamma
        cost = self.step_cost * (k - 1 if g == 1.0 else (1.0 - g ** (k - 1)) / (1.0 - g))
        return -cost + g ** (k - 1) * self.stop_rewards

    def optimal_depth(self) -> int:
        """The depth an oracle knowing this episode's rewards would stop at (ties: shallowest)."""
        return int(np.argmax(self.returns())) + 1


@dataclass(frozen=True)
class Replay:
    """Every transition of every episode, state-indexed.

    State ``i`` (row of ``states``) has a STOP transition with reward ``stop_reward[i]`` and,
    when ``has_next[i]``, a CONTINUE transition with reward ``-step_cost`` into state
    ``i + 1``. ``next_is_cap[i]``: state ``i + 1`` is at its episode's cap (only STOP valid).
    """

    states: np.ndarray  # float32 (M, F)
    stop_reward: np.ndarray  # float32 (M,)
    has_next: np.ndarray  # bool (M,)
    next_is_cap: np.ndarray  # bool (M,)
    depth: np.ndarray  # int32 (M,), k of each state
    episode_index: np.ndarray  # int32 (M,)

    @property
    def n_states(self) -> int:
        return int(self.states.shape[0])


def build_replay(
    episodes: Sequence[Episode],
    *,
    reward: str | RewardFn | NeedsReward = "bor",
    max_depth: int = DEFAULT_MAX_DEPTH,
    featurize: Featurize | None = None,
) -> Replay:
    """All states and transitions of ``episodes`` (exhaustive replay for DQN)."""
    if not episodes:
        raise ValueError("no episodes")
    if reward == "needs":
        reward = NeedsReward()
    reward_fn: RewardFn | NeedsReward = reward if isinstance(reward, NeedsReward) else get_reward_fn(reward)
    featurize = featurize or _schema1
    feats, rewards, has_next, next_cap, depth, owner = [], [], [], [], [], []
    for i, ep in enumerate(episodes):
        d = depth_cap(ep, max_depth)
        feats.append(featurize(ep, d))
        rewards.append(stop_rewards(ep, reward=reward_fn, max_depth=d))
        hn = np.ones(d, dtype=bool)
        hn[-1] = False
        has_next.append(hn)
        nc = np.zeros(d, dtype=bool)
        if d >= 2:
            nc[d - 2] = True
        next_cap.append(nc)
        depth.append(np.arange(1, d + 1, dtype=np.int32))
        owner.append(np.full(d, i, dtype=np.int32))
    return Replay(
        states=np.concatenate(feats).astype(np.float32),
        stop_reward=np.concatenate(rewards).astype(np.float32),
        has_next=np.concatenate(has_next),
        next_is_cap=np.concatenate(next_cap),
        depth=np.concatenate(depth),
        episode_index=np.concatenate(owner),
    )
