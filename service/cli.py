"""The shortlist command: serve, episodes, refit, train, train-embedder and evaluate."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from registry.offline.cli_support import HelpFormatter
from service.logging_setup import configure_logging

log = logging.getLogger("shortlist")
_STARTED = time.perf_counter()


def _serve(args: argparse.Namespace) -> int:
    from registry.runtime import limit_malloc_arenas, limit_native_threads

    limit_native_threads()  # before numpy is imported
    limit_malloc_arenas()
    from registry.errors import ShortlistError
    from service.app import create_app
    from service.server import serve
    from service.settings import ServiceSettings

    overrides = {
        key: value
        for key, value in (("host", args.host), ("port", args.port), ("data_dir", args.data_dir))
        if value is not None
    }
    settings = ServiceSettings(**overrides)
    configure_logging(args.log_level, settings.log_format)
    try:
        app = create_app(settings)
    except ShortlistError as exc:
        log.error("cannot start: %s", exc.message)
        return 2
    except OSError as exc:  # e.g. a read-only or missing data directory: one line, no traceback
        log.error("cannot start: %s", os_error_line(exc, settings.data_dir))
        return 2
    _announce(app, settings)
    serve(app, settings, log_level=args.log_level)  # limits and timeouts: service.server
    return 0


def os_error_line(exc: OSError, data_dir: Any) -> str:
    """``[Errno 30] Read-only file system: '/d/registries'`` as one line naming the setting."""
    name = str(exc.filename or "")
    line = f"{exc.strerror or exc}: {name!r}" if name else str(exc.strerror or exc)
    if name and name.startswith((str(data_dir), str(Path(data_dir).resolve()))):
        line += " (in the data directory, SHORTLIST_DATA_DIR: it must be writable)"
    return line


def base_url(host: str, port: int) -> str:
    """The URL to open for a server bound to ``host`` (a wildcard address shows as localhost)."""
    shown = "localhost" if host in ("0.0.0.0", "::", "") else host
    return f"http://[{shown}]:{port}" if ":" in shown else f"http://{shown}:{port}"


def _announce(app: Any, settings: Any) -> None:
    """Log where the service is, a line every 10 s while it loads, and the console URL once
    it is ready (the first start exports the embedder to ONNX, silently otherwise)."""
    state = app.state.service
    url = base_url(settings.host, settings.port)
    from registry.index.minilm_export import EMBEDDER_FILES, embedder_onnx_path

    cache = settings.resolved_embedder_cache()
    log.info("tool-shortlist on %s, data in %s", url, settings.data_dir)
    exporting = not embedder_onnx_path(cache, settings.embedder).is_file()
    if exporting:
        log.info("first start: exporting the %s embedder to ONNX, once, cached in %s: %s",
                 settings.embedder, cache, EMBEDDER_FILES[settings.embedder].description)

    def watch() -> None:
        beat = 10.0
        while not state.ready and state.load_error is None:
            time.sleep(0.2)
            waited = time.perf_counter() - _STARTED
            if waited >= beat:
                what = "exporting the embedder" if exporting else "loading the registries"
                log.info("still starting (%s, %.0f s)", what, waited)
                beat += 10.0
        if state.ready:
            log.info(
                "ready in %.1f s: console %s/console, API docs %s/docs",
                time.perf_counter() - _STARTED, url, url,
            )

    threading.Thread(target=watch, name="announce", daemon=True).start()


def _episodes(args: argparse.Namespace) -> int:
    from registry.index.embedders import load_minilm
    from registry.index.hybrid import SCORERS
    from registry.offline.datasets import dataset_episodes
    from registry.offline.episodes import save_episodes
    from registry.settings import Settings

    settings = Settings()
    args.scorer = args.scorer or settings.default_scorer
    if args.scorer not in SCORERS:
        print(f"shortlist episodes: unknown scorer {args.scorer!r}; use one of {list(SCORERS)}", file=sys.stderr)
        return 2
    embedder = None if args.scorer == "bm25" else load_minilm(settings.resolved_embedder_cache())
    episodes, meta = dataset_episodes(
        args.data, embedder, args.scorer, max_queries=args.max_queries, seed=args.seed
    )
    save_episodes(args.out, episodes, meta)
    print(f"{len(episodes)} episodes ({meta['dataset']}, N={meta['n_tools']}, {args.scorer}) -> {args.out}")
    return 0


def _refit(args: argparse.Namespace) -> int:
    """Refit a registry's depth policy from its feedback; prints the job (exit 0 unless failed,
    2 when the registry does not exist in the configured store)."""
    import json

    from registry.assembly import refit_from_settings
    from registry.errors import ShortlistError
    from registry.settings import Settings

    try:
        job = refit_from_settings(Settings(), args.registry)
    except ShortlistError as exc:
        print(f"shortlist refit: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(job.to_json(), indent=2))
    return 1 if job.state == "failed" else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shortlist", description=__doc__, formatter_class=HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve", help="run the HTTP service", description="Run the HTTP service (settings: "
        "SHORTLIST_* environment variables, see registry/settings.py).", formatter_class=HelpFormatter,
    )
    serve.add_argument("--host", default=None, help="bind address (default: SHORTLIST_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default: SHORTLIST_PORT or 8080)")
    serve.add_argument(
        "--data-dir", type=Path, default=None, help="data directory (default: SHORTLIST_DATA_DIR or ./data)"
    )
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"],
        help="least level logged (the format is SHORTLIST_LOG_FORMAT: text or json)",
    )
    serve.set_defaults(handler=_serve)

    episodes = commands.add_parser(
        "episodes", help="rank a labelled data set (tools.json + queries.jsonl) into training episodes",
        description="Rank a labelled data set into training episodes for shortlist train --episodes.",
        formatter_class=HelpFormatter,
    )
    episodes.add_argument("--data", type=Path, required=True, help="data directory (tools.json + queries.jsonl)")
    episodes.add_argument(
        "--scorer", default=None, help="dense, bm25 or hybrid (default: SHORTLIST_DEFAULT_SCORER, hybrid)"
    )
    episodes.add_argument(
        "--max-queries", type=int, default=None, help="sample this many queries (default: all)"
    )
    episodes.add_argument("--seed", type=int, default=0, help="query sample seed")
    episodes.add_argument("--out", type=Path, required=True, help="episode file to write (.npz)")
    episodes.set_defaults(handler=_episodes)

    refit = commands.add_parser(
        "refit",
        help="refit a registry's depth policy from its logged feedback (SHORTLIST_* settings "
        "choose the store); activates it only when it beats the current one on held-out feedback",
        description="Refit one registry's depth policy from the feedback logged for its "
        "shortlists, outside any server. The store is the one the SHORTLIST_* settings name (the "
        "data directory, or Redis with SHORTLIST_REDIS_URL). The new policy is activated only "
        "when it beats the current one on held-out feedback; running replicas pick it up (Redis: "
        "at their next policy poll; local: at restart). Prints the job as JSON; exit 1 if it "
        "failed, 2 if the registry does not exist.",
        formatter_class=HelpFormatter,
    )
    refit.add_argument("--registry", required=True, help="the registry whose policy is refitted")
    refit.set_defaults(handler=_refit)

    # `train` and `evaluate` hand their arguments to their own parsers (`shortlist train --help`).
    commands.add_parser(
        "train", help="train a DQN depth policy on data directories or episode files", add_help=False
    )
    commands.add_parser(
        "train-embedder",
        help="train the tool adapter of the 'tuned' embedders (LOSO figures, then on all sources)",
        add_help=False,
    )
    commands.add_parser(
        "evaluate", help="evaluate depth policies on data directories (JSON, Markdown, PNG)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    configure_logging("info")  # serve reconfigures with its --log-level and SHORTLIST_LOG_FORMAT
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from registry.offline.train_cli import main as train_main

        return train_main(argv[1:])
    if argv[:1] == ["train-embedder"]:
        from registry.offline.train_embedder import main as train_embedder_main

        return train_embedder_main(argv[1:])
    if argv[:1] == ["evaluate"]:
        from registry.offline.evaluate_cli import main as evaluate_main

        return evaluate_main(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
