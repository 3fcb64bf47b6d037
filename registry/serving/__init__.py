"""What a query touches, and nothing else: read the request, rank, compose, decide the depth.

* :mod:`registry.serving.shortlist`: ``QueryRunner``, the query path from request to ``Shortlist``
  (:mod:`registry.serving.result`).
* :mod:`registry.serving.intents`, :mod:`registry.serving.windows`: reading the request (intents,
  long-text windows).
* :mod:`registry.serving.compose`: near-duplicates folded, intent coverage, named tools first.
* :mod:`registry.serving.depth_policies`: the depth decision (learned ONNX policy, fixed, gap,
  threshold); :mod:`registry.serving.features` the features it reads (shared with training).
* :mod:`registry.serving.stop_rules`: per-registry stop rules and their versions;
  :mod:`registry.serving.explore` logged exploration around them.
* :mod:`registry.serving.relevance`: "does any tool fit" (``allow_empty``).

Nothing here imports :mod:`registry.offline` (training, evaluation); offline may import serving.
"""
