"""Build an unseen evaluation registry from BFCL "live" (user-contributed, real-world functions).

    pip download --no-deps bfcl-eval==2026.3.23 -d /tmp/bfcl && cd /tmp/bfcl && unzip -q -o bfcl_eval-*.whl
    python bench/studies/convert_bfcl_live.py /tmp/bfcl/bfcl_eval/data --out data/bfcl_live

Pools the functions offered in live_simple and live_multiple (de-duplicated by name, first
definition wins, BFCL's "dict" pseudo-type mapped to "object"), and writes tools.json plus
queries.jsonl (query = the first user message, gold = the ground-truth function name(s)).
No policy is trained on this data: it is the "registry nobody trained on".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PSEUDO_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def openapi_types(schema):
    if isinstance(schema, dict):
        out = {k: openapi_types(v) for k, v in schema.items()}
        if isinstance(out.get("type"), str):
            out["type"] = PSEUDO_TYPES.get(out["type"], out["type"])
        return out
    if isinstance(schema, list):
        return [openapi_types(v) for v in schema]
    return schema


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="bfcl_eval/data directory from the wheel")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tools: dict[str, dict] = {}
    queries = []
    for category in ("live_simple", "live_multiple"):
        answers = {}
        for line in (args.data / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines():
            row = json.loads(line)
            answers[row["id"]] = row["ground_truth"]
        for line in (args.data / f"BFCL_v4_{category}.json").read_text().splitlines():
            row = json.loads(line)
            for function in row["function"]:
                tools.setdefault(function["name"], {
                    "name": function["name"],
                    "description": function.get("description", ""),
                    "parameters": openapi_types(function.get("parameters", {})),
                })
            user = [m["content"] for turn in row["question"] for m in turn if m["role"] == "user"]
            gold = sorted({name for call in answers[row["id"]] for name in call})
            if user and gold:
                queries.append({"id": row["id"], "query": user[0], "gold": gold})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tools.json").write_text(json.dumps(list(tools.values()), indent=1, ensure_ascii=False))
    with open(args.out / "queries.jsonl", "w") as handle:
        for q in queries:
            handle.write(json.dumps(q, ensure_ascii=False) + "\n")
    print(f"{len(tools)} tools, {len(queries)} queries -> {args.out}")


if __name__ == "__main__":
    main()
