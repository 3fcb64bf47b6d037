"""Learning from agents' feedback: the usage memory and the refits, never the query path itself.

Usage-augmented ranking: :mod:`registry.learning.usage` (the memory: ``UsageMemory``),
:mod:`registry.learning.learner` (``UsageLearner``: the memory inside a service),
:mod:`registry.store.learning` (where it is kept). Per-registry refits of the stop rule:
:mod:`registry.learning.refit`, :mod:`registry.learning.manager`. What a query calls (stop rules,
exploration) is in :mod:`registry.serving`; the learner is built in :mod:`registry.assembly`.
Nothing is imported here, so importing one module does not pull in the others.
"""
