"""`tollgate cache eval`: the semantic cache's quality, measured with the same code that serves hits.

Per embedder (all-MiniLM-L6-v2 or multilingual-e5-small), two kinds of data:
- GPTCache's question pairs (loadtest/data/gptcache, MIT): originals indexed, rewrites queried. Hit rate; hits whose top
  candidate is another question's original (wrong original on top); and the false-hit rate when each
  query's own original is left out (every hit is then counted wrong, though the set holds originals that restate
  one another). Also swept over thresholds, from the same vectors.
- Hand-written pair files (loadtest/data/cache_pairs.yaml, English; cache_pairs_ko.yaml, Korean): near-miss pairs
  (a hit is a wrong answer) by category, and paraphrase pairs (a hit is right); ``paraphrase_second_round`` holds
  paraphrases written after the verifier was tuned, reported apart.
Each figure at the threshold, with the verifier on and off.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from gateway.cache.verifier import verify
from gateway.policy.schema import CachePolicy, E5Embedding, SentenceTransformersEmbedding

ROOT = Path(__file__).resolve().parents[2]
GPTCACHE = ROOT / "loadtest" / "data" / "gptcache" / "mock_data.json"
PAIRS = ROOT / "loadtest" / "data" / "cache_pairs.yaml"
PAIRS_KO = ROOT / "loadtest" / "data" / "cache_pairs_ko.yaml"
EMBEDDERS = ("e5", "minilm")
SPECS = {"e5": E5Embedding(), "minilm": SentenceTransformersEmbedding(kind="sentence-transformers")}
SWEEP = (0.95, 0.96, 0.97, 0.98, 0.985, 0.99)


class BatchEmbedder(Protocol):
    name: str

    def embed_many(self, texts: Sequence[str]) -> np.ndarray: ...

    def close(self) -> None: ...


def load_embedder(kind: str) -> BatchEmbedder:
    """The embedder the report measures, by its short name (see EMBEDDERS)."""
    from gateway.cache.embedder import E5Embedder, MiniLMEmbedder

    if kind == "e5":
        return E5Embedder()
    if kind == "minilm":
        return MiniLMEmbedder()
    raise ValueError(f"unknown embedder {kind!r}: one of {', '.join(EMBEDDERS)}")


@dataclass
class PairResult:
    category: str
    a: str
    b: str
    cosine: float
    rejected_by: str | None


def _served(cosine: float, reason: str | None, threshold: float, verifier: bool) -> bool:
    return cosine >= threshold and (not verifier or reason is None)


def gptcache(embedder: BatchEmbedder, path: Path, threshold: float,
             sweep: Sequence[float] = ()) -> dict[str, Any]:
    data = json.loads(path.read_text())
    originals = sorted({d["origin"] for d in data})
    position = {q: i for i, q in enumerate(originals)}
    index_vecs = embedder.embed_many(originals)
    query_vecs = embedder.embed_many([d["similar"] for d in data])
    scores = query_vecs @ index_vecs.T
    orders = np.argsort(-scores, axis=1)[:, :5]

    def measure(at: float, verifier: bool) -> dict[str, Any]:
        hits = right = wrong = false_hits = 0
        for row, d in enumerate(data):
            own = position[d["origin"]]
            hit = _first_served(orders[row], scores[row], originals, d["similar"], at, verifier, skip=None)
            if hit is not None:
                hits += 1
                right += hit == own
                wrong += hit != own
            if _first_served(orders[row], scores[row], originals, d["similar"], at, verifier, skip=own) is not None:
                false_hits += 1
        return {"hit_rate": hits / len(data), "right_original": right, "wrong_original_on_top": wrong,
                "false_hit_rate_own_left_out": false_hits / len(data)}

    out: dict[str, Any] = {"queries": len(data), "originals": len(originals), "threshold": threshold,
                           "verifier_off": measure(threshold, False), "verifier_on": measure(threshold, True)}
    out["sweep_verifier_on"] = {str(at): measure(at, True) for at in sweep}
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


def pairs(embedder: BatchEmbedder, path: Path) -> tuple[list[PairResult], list[PairResult]]:
    """Near-misses (category per row) and paraphrases (category ``paraphrase`` or ``paraphrase_second_round``)."""
    doc = yaml.safe_load(path.read_text())
    near = [(cat, a, b) for cat, items in doc["near_miss"].items() for a, b in items]
    para = [(key, a, b) for key in ("paraphrase", "paraphrase_second_round") for a, b in doc.get(key) or ()]

    def score(rows: list[tuple[str, str, str]]) -> list[PairResult]:
        va = embedder.embed_many([a for _, a, _ in rows])
        vb = embedder.embed_many([b for _, _, b in rows])
        cos = np.sum(va * vb, axis=1)
        # b is the new question, a the cached one
        return [PairResult(c, a, b, float(s), verify(b, a)) for (c, a, b), s in zip(rows, cos, strict=True)]
    return score(near), score(para)


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "0%"


def _gptcache_lines(g: dict[str, Any]) -> list[str]:
    lines = [f"GPTCache pairs ({g['queries']} rewrites queried against {g['originals']} originals):", "",
             "| verifier | hit rate | right / wrong original on top | false hits, own original left out |",
             "|---|---|---|---|"]
    for key, label in (("verifier_off", "off"), ("verifier_on", "on")):
        r = g[key]
        lines.append(f"| {label} | {r['hit_rate']:.1%} | {r['right_original']} / {r['wrong_original_on_top']} | "
                     f"{r['false_hit_rate_own_left_out']:.1%} |")
    if g["sweep_verifier_on"]:
        lines += ["", "The same, verifier on, by threshold:", "",
                  "| threshold | hit rate | right / wrong original on top | false hits, own original left out |",
                  "|---|---|---|---|"]
        for at, r in g["sweep_verifier_on"].items():
            lines.append(f"| {at} | {r['hit_rate']:.1%} | {r['right_original']} / {r['wrong_original_on_top']} | "
                         f"{r['false_hit_rate_own_left_out']:.1%} |")
    return [*lines, ""]


def _pair_lines(path: Path, near: list[PairResult], para: list[PairResult], threshold: float
                ) -> tuple[list[str], dict[str, Any]]:
    by_cat: dict[str, list[PairResult]] = {}
    for r in near:
        by_cat.setdefault(r.category, []).append(r)
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    lines = [f"Hand-written pairs ({name}): near-misses served = wrong answers.", "",
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
    lines.append("")
    figures: dict[str, Any] = {}
    for key in ("paraphrase", "paraphrase_second_round"):
        rows = [r for r in para if r.category == key]
        if not rows:
            continue
        off = sum(_served(r.cosine, r.rejected_by, threshold, False) for r in rows)
        on = sum(_served(r.cosine, r.rejected_by, threshold, True) for r in rows)
        lines += [f"{key} ({len(rows)} pairs): hits {off} with the verifier off, {on} with it on (the verifier "
                  f"costs {off - on} hits, {_share(off - on, off)} of plain cosine's; "
                  f"{sum(r.cosine < threshold for r in rows)} score below {threshold} and miss anyway).", ""]
        figures[key] = {"pairs": len(rows), "hits_verifier_off": off, "hits_verifier_on": on,
                        "rejected": [(r.a, r.b, r.rejected_by) for r in rows
                                     if r.cosine >= threshold and r.rejected_by]}
    reasons: dict[str, int] = {}
    for r in near:
        if r.cosine >= threshold and r.rejected_by:
            reasons[r.rejected_by] = reasons.get(r.rejected_by, 0) + 1
    lines += ["Verifier rejections of near-misses above the threshold, by reason: "
              + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1])), ""]
    main = figures.get("paraphrase", {"pairs": 0, "hits_verifier_off": 0, "hits_verifier_on": 0, "rejected": []})
    figures.update({
        "near_miss": len(near), "near_miss_served_verifier_off": served_off, "near_miss_served_verifier_on": served_on,
        "paraphrases": main["pairs"], "paraphrase_hits_verifier_off": main["hits_verifier_off"],
        "paraphrase_hits_verifier_on": main["hits_verifier_on"], "rejected_paraphrases": main["rejected"],
        "rejections": reasons,
        "served_near_misses": [(r.category, r.a, r.b, round(r.cosine, 4)) for r in near
                               if _served(r.cosine, r.rejected_by, threshold, True)]})
    return lines, figures


def report(threshold: float | None = None, data: Path | None = GPTCACHE,
           pair_files: Sequence[Path] = (PAIRS, PAIRS_KO),
           embedders: Sequence[str] = ("e5",)) -> tuple[str, dict[str, Any]]:
    """The report as markdown, and its figures (per embedder: ``gptcache`` and one entry per pair file), at
    ``threshold`` or else each embedder's own default (what the policy uses when it names none)."""
    results: dict[str, Any] = {}
    lines: list[str] = []
    for kind in embedders:
        embedder = load_embedder(kind)
        own = threshold if threshold is not None else CachePolicy(embedder=SPECS[kind]).threshold
        figures: dict[str, Any] = {"model": embedder.name, "threshold": own}
        lines += [f"### Semantic cache quality ({embedder.name}, cosine >= {own})", ""]
        try:
            if data is not None and data.exists():
                figures["gptcache"] = gptcache(embedder, data, own, SWEEP)
                lines += _gptcache_lines(figures["gptcache"])
            for path in pair_files:
                near, para = pairs(embedder, path)
                text, figures[path.name] = _pair_lines(path, near, para, own)
                lines += text
        finally:
            embedder.close()
        results[kind] = figures
    return "\n".join(lines) + "\n", results
