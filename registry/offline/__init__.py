"""Offline evaluation and training data in one place, used by train, evaluate and every bench.

* :mod:`registry.offline.tables`: score tables (every query x every tool) and ranked episodes.
* :mod:`registry.offline.metrics`: the found-at-K curve (any / all), BoR over episodes,
  ``K_eq`` and depth efficiency, policy evaluation against fixed depths.

Reports (Markdown, JSON, plots) live in :mod:`registry.offline.evaluate`, the ``shortlist evaluate``
CLI in :mod:`registry.offline.evaluate_cli`.
"""
