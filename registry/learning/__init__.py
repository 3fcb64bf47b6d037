"""Learning from agents' feedback.

Usage-augmented ranking: :mod:`registry.learning.usage` (the memory: ``UsageMemory``),
:mod:`registry.learning.learner` (``UsageLearner``: the memory inside a service),
:mod:`registry.learning.persist` (where it is kept) and :mod:`registry.learning.wiring` (built
for a store). Depth exploration and per-registry refits: :mod:`registry.learning.explore`,
:mod:`registry.learning.policies`. Nothing is imported here, so importing one module does not
pull in the others.
"""
