"""Write docs/configuration.md from the domain's and the service's settings.

    python -m service.settings_doc            # rewrite docs/configuration.md
    python -m service.settings_doc --check    # exit 1 if it is stale

The renderer is :mod:`registry.settings_doc`; this command lives in the web layer because only it
knows both classes (the domain never imports the service).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from registry.settings import Settings
from registry.settings_doc import COMMAND, DOC, ROOT, render
from service.settings import ServiceSettings

CLASSES = (ServiceSettings, Settings)  # the service's own groups first, then the domain's


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed file is stale")
    parser.add_argument("--out", type=Path, default=DOC, help=f"default: {DOC.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    text = render(CLASSES)
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
