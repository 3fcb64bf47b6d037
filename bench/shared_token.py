"""One shared query token (issue 23 item 2): what 1 / 10 / 30 attacker events do to found@1 of
the right tool on near-paraphrases, and whether 30 legitimate events then undo them.

In-process core (real MiniLM), the demo registry, every caller the same token hash (the common
deployment: no X-Caller-Id). The attacker claims ``get_weather_forecast`` for current-weather
requests; the probe set is 12 such requests none of the events used. Run it on two checkouts (PYTHONPATH)
for before/after figures.

    nice -n 10 python bench/shared_token.py [--out bench/out/shared_token.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import DEFAULT_EMBEDDER_CACHE, ROOT
from registry.core import Shortlister
from registry.settings import Settings

RIGHT, WRONG = "get_weather", "get_weather_forecast"
CITIES = ("paris", "rome", "oslo", "lima", "cairo", "tokyo", "delhi", "quito", "accra", "hanoi",
          "kyiv", "dakar", "perth", "porto", "riga", "sofia", "tunis", "turin", "wuhan", "zagreb",
          "basel", "bern", "cork", "doha", "fez", "graz", "hue", "ipoh", "jena", "kobe", "linz", "malmo",
          "nice", "ohrid", "pune", "split", "tartu", "ulm", "vigo", "york", "zadar", "agra")
TEXTS = [f"what is the weather like right now in {c}" for c in CITIES]
PROBES, ATTACK, HONEST = TEXTS[:12], TEXTS[12:42], TEXTS[12:42]
CALLER = "shared-token-hash"


def found_at_1(core: Shortlister) -> float:
    hits = sum(core.shortlist("demo", q, k=1, caller=CALLER).tools[0].name == RIGHT for q in PROBES)
    return round(100 * hits / len(PROBES), 1)


def send(core: Shortlister, texts: list[str], tool: str) -> list[str]:
    outcomes = []
    for text in texts:
        result = core.shortlist("demo", text, caller=CALLER)
        outcomes.append(core.feedback(result.shortlist_id, [tool], success=True, caller=CALLER))
    return [str(getattr(o, "learning", o)) for o in outcomes]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tools = json.loads((ROOT / "examples" / "demo_tools.json").read_text())
    rows: list[dict[str, Any]] = []
    for attack in (1, 10, 30):
        with tempfile.TemporaryDirectory() as tmp:
            settings = Settings(data_dir=Path(tmp), embedder_cache_dir=DEFAULT_EMBEDDER_CACHE,
                                demo_registry=None, query_token=(SecretStr("one-shared-token-0123456789"),))
            core = Shortlister.from_settings(settings, start=True)
            try:
                core.put_registry("demo", tools)
                base = found_at_1(core)
                send(core, ATTACK[:attack], WRONG)
                poisoned = found_at_1(core)
                send(core, HONEST, RIGHT)
                repaired = found_at_1(core)
                report = core.learning_report("demo")
            finally:
                core.close()
        row = {"attack_events": attack, "found@1_before": base, "after_attack": poisoned,
               "after_30_legitimate": repaired, "counted": report.get("events"),
               "skipped": report.get("skipped")}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
