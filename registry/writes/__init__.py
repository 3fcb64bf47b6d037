"""The write path: registries as immutable snapshots, and how a new version gets in.

* :mod:`registry.writes.engine`: ``ShortlistEngine``, the registry snapshots and their writes.
* :mod:`registry.writes.jobs`: prepared writes (parse, validate, embed off the lock), group
  commit.
* :mod:`registry.writes.write_jobs`: 202 write jobs, durable across restarts
  (:mod:`registry.jobs`).
* :mod:`registry.writes.commits`: the commit path (sync, derive, persist, install).
* :mod:`registry.writes.sync`: replicas installing what other replicas wrote.
"""
