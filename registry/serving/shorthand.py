"""Shorthand users type ("open a PR", "DM Bob", "the k8s cfg"), spelled out before ranking.

Tool definitions spell words out ("Create a new pull request in a GitHub repository"); requests
abbreviate. MiniLM's vocabulary has no useful vector for "pr" or "cfg", and BM25 matches no
term, so "open a PR from feature-x into main" ranked ``push_files`` above
``create_pull_request``. :func:`expand_shorthand` appends each known abbreviation's spelled-out
form right after it, in parentheses ("open a PR (pull request) from ..."), and leaves every
other character alone: the original token still matches a tool that uses the abbreviation
itself, and a request without shorthand is returned unchanged (same embedding, same cache key).

The table is deliberately short and unambiguous in a tool-calling context: software and
messaging shorthand whose expansion is the word tool descriptions use. Words with two common
readings ("temp": temperature or temporary, "dev": developer or development, "pwd") stay out.
Matching is on whole words, case-insensitive except for :data:`SHORTHAND_UPPER` ("MR" is a merge
request, "Mr." a title; "CI" stays out, as a gorilla request uses it for a compute instance); an expansion the text already carries next to the
abbreviation ("PR (pull request)") is not added twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["SHORTHAND", "SHORTHAND_UPPER", "expand_shorthand"]

SHORTHAND: Mapping[str, str] = MappingProxyType(
    {
        # code hosting and CI
        "pr": "pull request",
        "prs": "pull requests",
        "repo": "repository",
        "repos": "repositories",
        "gh": "GitHub",
        "pkg": "package",
        "pkgs": "packages",
        "deps": "dependencies",
        # messaging and calendars
        "dm": "direct message",
        "dms": "direct messages",
        "msg": "message",
        "msgs": "messages",
        "cal": "calendar",
        "mtg": "meeting",
        "appt": "appointment",
        "notif": "notification",
        "notifs": "notifications",
        "tmrw": "tomorrow",
        "tmr": "tomorrow",
        "wx": "weather",
        "tz": "time zone",
        # systems and configuration
        "cfg": "configuration",
        "config": "configuration",
        "conf": "configuration",
        "env": "environment",
        "envs": "environments",
        "k8s": "Kubernetes",
        "db": "database",
        "dbs": "databases",
        "dir": "directory",
        "dirs": "directories",
        "proc": "process",
        "procs": "processes",
        "auth": "authentication",
        "perms": "permissions",
        "creds": "credentials",
        "vm": "virtual machine",
        "vms": "virtual machines",
        "prod": "production",
        "svc": "service",
        "ns": "namespace",
        # data and accounts
        "txn": "transaction",
        "txns": "transactions",
        "acct": "account",
        "addr": "address",
        "coords": "coordinates",
        "elev": "elevation",
        "img": "image",
        "imgs": "images",
        "pic": "picture",
        "pics": "pictures",
        "vid": "video",
        "del": "delete",
        "obs": "observations",
        "rels": "relations",
        "prev": "previous",
        "nav": "navigate",
        "avg": "average",
        "stats": "statistics",
        "qty": "quantity",
        "info": "information",
    }
)

# Expanded only as written in capitals: in lower or title case they are other words ("Mr. X").
SHORTHAND_UPPER: Mapping[str, str] = MappingProxyType({"MR": "merge request", "MRs": "merge requests"})

# A whole word (letters and digits, as "k8s"), optionally followed by an existing parenthesis;
# never part of a file name, path or identifier ("config.yaml", ".env", "org/repo", "PR-12").
_WORD = re.compile(r"(?<![\w./-])([A-Za-z][A-Za-z0-9]*)(?![\w-]|[./]\w)(\s*\(([^)]*)\))?")


def expand_shorthand(text: str) -> str:
    """``text`` with each known abbreviation followed by its spelled-out form in parentheses.

    >>> expand_shorthand("open a PR from feature-x into main")
    'open a PR (pull request) from feature-x into main'
    >>> expand_shorthand("list the files")
    'list the files'
    """

    def spell(match: re.Match[str]) -> str:
        word, following, inside = match.group(1), match.group(2), match.group(3)
        long = SHORTHAND_UPPER.get(word) or SHORTHAND.get(word.lower())
        if long is None or (inside is not None and long.lower() in inside.lower()):
            return match.group(0)
        return f"{word} ({long}){following or ''}"

    return _WORD.sub(spell, text)
