"""The local backend: every store in files under the data directory (one process per directory)."""

from __future__ import annotations

from registry.feedback import LocalFeedbackLog, ShortlistMemory
from registry.settings import FeedbackArgs, StoreArgs
from registry.store.caller_key import FixedKey, fixed_key, local_caller_key
from registry.store.job_records import LocalJobRecords
from registry.store.learning import LocalLearningStore
from registry.store.local import LocalStore
from registry.store.policies import LocalPolicyStore
from registry.store.stores import Stores

__all__ = ["local_stores"]


def local_stores(store: StoreArgs, feedback: FeedbackArgs) -> Stores:
    """Registries, feedback log, learning, policies and jobs under ``store.data_dir``; the
    shortlists awaiting feedback in memory (a graceful shutdown saves them)."""
    data_dir = store.data_dir
    return Stores(
        registries=LocalStore(data_dir),
        shortlists=ShortlistMemory(feedback.feedback_retention_seconds, feedback.max_remembered_shortlists),
        feedback_log=LocalFeedbackLog.in_data_dir(data_dir, archive=feedback.feedback_archive),
        learning=LocalLearningStore(data_dir),
        policies=LocalPolicyStore(data_dir),
        job_records=LocalJobRecords(data_dir),
        caller_key=fixed_key(store.caller_key) or FixedKey(local_caller_key(data_dir)),
    )

