"""The write path: how a new registry version gets into the snapshot map (:mod:`registry.snapshots`).

Never imports the query path (:mod:`registry.serving`; ``tests/test_architecture.py``).

* :mod:`registry.writes.writer`: ``RegistryWriter``: load, replicate and change the registries.
* :mod:`registry.writes.prepared`: prepared writes (parse, validate, embed off the lock), group
  commit.
* :mod:`registry.writes.write_jobs`: 202 write jobs, durable across restarts
  (:mod:`registry.job_queue`).
* :mod:`registry.writes.commits`: the commit path (sync, derive, persist, install).
* :mod:`registry.writes.sync`: replicas installing what other replicas wrote.
"""
