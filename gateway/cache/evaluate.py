"""`tollgate cache eval`: the semantic cache's quality, measured with the same code that serves hits.

Two data sets:
- GPTCache's question pairs (loadtest/data/gptcache, MIT): originals indexed, rewrites queried. Hit rate; hits whose top
  candidate is another question's original (wrong original on top); and the false-hit rate when each
  query's own original is left out (every hit is then a wrong answer).
- loadtest/data/cache_pairs.yaml: near-miss pairs (a hit is a wrong answer) and paraphrase pairs
  (a hit is right), by category.
Each figure at the threshold, with the verifier on and off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gateway.cache.embedder import MiniLMEmbedder
from gateway.cache.verifier import verify

ROOT = Path(__file__).resolve().parents[2]
GPTCACHE = ROOT / "loadtest" / "data" / "gptcache" / "mock_data.json"
PAIRS = ROOT / "loadtest" / "data" / "cache_pairs.yaml"


@dataclass
class PairResult:
    category: str
    a: str
    b: str
    cosine: float
    rejected_by: str | None


def _served(cosine: float, reason: str | None, threshold: float, verifier: bool) -> bool:
    return cosine >= threshold and (not verifier or reason is None)


def gptcache(embedder: MiniLMEmbedder, path: Path, threshold: float) -> dict[str, Any]:
    data = json.loads(path.read_text())
    originals = sorted({d["origin"] for d in data})
    position = {q: i for i, q in enumerate(originals)}
    index_vecs = embedder.embed_many(originals)
    query_vecs = embedder.embed_many([d["similar"] for d in data])
    scores = query_vecs @ index_vecs.T
    out: dict[str, Any] = {"queries": len(data), "originals": len(originals), "threshold": threshold}
    for verifier in (False, True):
        hits = right = wrong = false_hits = 0
        for row, d in enumerate(data):
            own = position[d["origin"]]
            order = np.argsort(-scores[row])
            hit = _first_served(order, scores[row], originals, d["similar"], threshold, verifier, skip=None)
            if hit is not None:
                hits += 1
                right += hit == own
                wrong += hit != own
            if _first_served(order, scores[row], originals, d["similar"], threshold, verifier, skip=own) is not None:
                false_hits += 1
        key = "verifier_on" if verifier else "verifier_off"
        out[key] = {"hit_rate": hits / len(data), "right_original": right, "wrong_original_on_top": wrong,
                    "false_hit_rate_own_left_out": false_hits / len(data)}
    return out


def _first_served(order: np.ndarray, row: np.ndarray, originals: list[str], query: str, threshold: float,
                  verifier: bool, skip: int | None) -> int | None:
    """The index the cache would serve: the best candidates above threshold the verifier lets through."""
    for i in order[:5]:
        if skip is not None and i == skip:
            continue
        if row[i] < threshold:
            return None
        if not verifier or verify(query, originals[i]) is None:
            return int(i)
    return None


def pairs(embedder: MiniLMEmbedder, path: Path) -> tuple[list[PairResult], list[PairResult]]:
    doc = yaml.safe_load(path.read_text())
    near = [(cat, a, b) for cat, items in doc["near_miss"].items() for a, b in items]
    para = [("paraphrase", a, b) for a, b in doc["paraphrase"]]

    def score(rows: list[tuple[str, str, str]]) -> list[PairResult]:
        va = embedder.embed_many([a for _, a, _ in rows])
        vb = embedder.embed_many([b for _, _, b in rows])
        cos = np.sum(va * vb, axis=1)
        # b is the new question, a the cached one
        return [PairResult(c, a, b, float(s), verify(b, a)) for (c, a, b), s in zip(rows, cos, strict=True)]
    return score(near), score(para)


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "0%"


def report(threshold: float = 0.95, data: Path = GPTCACHE, pair_file: Path = PAIRS) -> tuple[str, dict[str, Any]]:
    embedder = MiniLMEmbedder()
    results: dict[str, Any] = {"threshold": threshold, "model": embedder.name}
    lines = [f"### Semantic cache quality (all-MiniLM-L6-v2, cosine >= {threshold})", ""]
    if data.exists():
        g = gptcache(embedder, data, threshold)
        results["gptcache"] = g
        lines += [f"GPTCache pairs ({g['queries']} rewrites queried against {g['originals']} originals):", "",
                  "| verifier | hit rate | right / wrong original on top | false hits, own original left out |",
                  "|---|---|---|---|"]
        for key, label in (("verifier_off", "off"), ("verifier_on", "on")):
            r = g[key]
            lines.append(f"| {label} | {r['hit_rate']:.1%} | {r['right_original']} / {r['wrong_original_on_top']} | "
                         f"{r['false_hit_rate_own_left_out']:.1%} |")
        lines.append("")
    near, para = pairs(embedder, pair_file)
    by_cat: dict[str, list[PairResult]] = {}
    for r in near:
        by_cat.setdefault(r.category, []).append(r)
    lines += [f"Hand-written pairs ({pair_file.relative_to(ROOT)}): near-misses served = wrong answers.", "",
              "| category | pairs | cosine >= threshold | served, verifier off | served, verifier on |",
              "|---|---|---|---|---|"]
    served_on = served_off = 0
    for cat, rows in by_cat.items():
        above = sum(r.cosine >= threshold for r in rows)
        off = sum(_served(r.cosine, r.rejected_by, threshold, False) for r in rows)
        on = sum(_served(r.cosine, r.rejected_by, threshold, True) for r in rows)
        served_off += off
        served_on += on
        lines.append(f"| {cat} | {len(rows)} | {above} | {off} | {on} |")
    lines.append(f"| **all near-misses** | {len(near)} | {sum(r.cosine >= threshold for r in near)} | "
                 f"**{served_off}** | **{served_on}** |")
    para_off = sum(_served(r.cosine, r.rejected_by, threshold, False) for r in para)
    para_on = sum(_served(r.cosine, r.rejected_by, threshold, True) for r in para)
    lines += ["", f"Paraphrases ({len(para)} pairs): hits {para_off} with the verifier off, {para_on} with it on "
              f"(the verifier costs {para_off - para_on} paraphrase hits, {_share(para_off - para_on, para_off)} of "
              f"plain cosine's; "
              f"{sum(r.cosine < threshold for r in para)} paraphrases score below {threshold} and miss anyway).", ""]
    reasons: dict[str, int] = {}
    for r in near:
        if r.cosine >= threshold and r.rejected_by:
            reasons[r.rejected_by] = reasons.get(r.rejected_by, 0) + 1
    lines.append("Verifier rejections of near-misses above the threshold, by reason: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])))
    results["pairs"] = {"near_miss": len(near), "near_miss_served_verifier_off": served_off,
                        "near_miss_served_verifier_on": served_on, "paraphrases": len(para),
                        "paraphrase_hits_verifier_off": para_off, "paraphrase_hits_verifier_on": para_on,
                        "paraphrase_cost": (para_off - para_on) / para_off if para_off else 0.0,
                        "rejected_paraphrases": [(r.a, r.b, r.rejected_by) for r in para
                                                 if r.cosine >= threshold and r.rejected_by],
                        "rejections": reasons,
                        "served_near_misses": [(r.a, r.b, round(r.cosine, 4)) for r in near
                                               if _served(r.cosine, r.rejected_by, threshold, True)]}
    embedder.close()
    return "\n".join(lines) + "\n", results
