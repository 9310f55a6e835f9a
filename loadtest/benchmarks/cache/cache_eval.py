"""The semantic cache's quality: hits, wrong hits, near misses (python -m loadtest run cache_eval).

An offline evaluation, measured with the same code that serves hits (gateway.cache: the embedders, the verifier);
also ``tollgate cache eval``, which takes the same flags. It starts no process.

Per embedder (all-MiniLM-L6-v2 or multilingual-e5-small), two kinds of data:
- GPTCache's question pairs (loadtest/data/gptcache, MIT): originals indexed, rewrites queried. Hit rate; hits whose top
  candidate is another question's original (wrong original on top); and the false-hit rate when each
  query's own original is left out (every hit is then counted wrong, though the set holds originals that restate
  one another). Also swept over thresholds, from the same vectors.
- Hand-written pair files (loadtest/data/cache_pairs.yaml, English; cache_pairs_ko.yaml, Korean; and
  cache_pairs_roles.yaml / cache_pairs_roles_ko.yaml: role swaps, direction swaps, opposite actions): near-miss pairs
  (a hit is a wrong answer) by category, and paraphrase pairs (a hit is right); ``paraphrase_second_round`` holds
  paraphrases written after the verifier was tuned, reported apart.
Each figure at the threshold, with the verifier on and off.

Every labelled set is split in two by ``split_of``: a hash of the pair's text (of the rewrite and its original, for
GPTCache's set) puts each pair in the tuning half or the test half, whatever the file's order. The verifier and the
thresholds are tuned on the tuning half only; the test half is the result (``--half``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from gateway.cache.verifier import verify
from gateway.policy.schema import CachePolicy, E5Embedding, SentenceTransformersEmbedding

ROOT = Path(__file__).resolve().parents[3]
GPTCACHE = ROOT / "loadtest" / "data" / "gptcache" / "mock_data.json"
PAIRS = ROOT / "loadtest" / "data" / "cache_pairs.yaml"
PAIRS_KO = ROOT / "loadtest" / "data" / "cache_pairs_ko.yaml"
PAIRS_ROLES = ROOT / "loadtest" / "data" / "cache_pairs_roles.yaml"
PAIRS_ROLES_KO = ROOT / "loadtest" / "data" / "cache_pairs_roles_ko.yaml"
PAIR_FILES = (PAIRS, PAIRS_KO, PAIRS_ROLES, PAIRS_ROLES_KO)
HALVES = ("tuning", "test")
EMBEDDERS = ("e5", "minilm")
SPECS = {"e5": E5Embedding(), "minilm": SentenceTransformersEmbedding(kind="sentence-transformers")}
SWEEP = (0.95, 0.96, 0.97, 0.98, 0.985, 0.99)


def split_of(first: str, second: str) -> str:
    """The half a labelled pair belongs to: "tuning" or "test", from the SHA-256 of its two texts (stable across
    runs, machines and file order; about half each)."""
    digest = hashlib.sha256(f"{first}\n{second}".encode()).digest()
    return HALVES[digest[0] & 1]


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
             sweep: Sequence[float] = (), half: str | None = None) -> dict[str, Any]:
    """Every original is indexed; the rewrites of ``half`` (all if None) are queried."""
    data = json.loads(path.read_text())
    originals = sorted({d["origin"] for d in data})
    if half is not None:
        data = [d for d in data if split_of(d["similar"], d["origin"]) == half]
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


def labelled(path: Path, half: str | None = None) -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(category, cached question, new question) rows of a pair file: near-misses and paraphrases, of ``half``
    (all if None)."""
    doc = yaml.safe_load(path.read_text())
    near = [(cat, a, b) for cat, items in doc["near_miss"].items() for a, b in items]
    para = [(key, a, b) for key in ("paraphrase", "paraphrase_second_round") for a, b in doc.get(key) or ()]
    if half is not None:
        near = [row for row in near if split_of(row[1], row[2]) == half]
        para = [row for row in para if split_of(row[1], row[2]) == half]
    return near, para


def pairs(embedder: BatchEmbedder, path: Path, half: str | None = None) -> tuple[list[PairResult], list[PairResult]]:
    """Near-misses (category per row) and paraphrases (category ``paraphrase`` or ``paraphrase_second_round``)."""
    near, para = labelled(path, half)

    def score(rows: list[tuple[str, str, str]]) -> list[PairResult]:
        if not rows:
            return []
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
           pair_files: Sequence[Path] = PAIR_FILES,
           embedders: Sequence[str] = ("e5",), halves: Sequence[str] = HALVES) -> tuple[str, dict[str, Any]]:
    """The report as markdown, and its figures (per embedder, per half: ``gptcache`` and one entry per pair file),
    at ``threshold`` or else each embedder's own default (what the policy uses when it names none)."""
    results: dict[str, Any] = {}
    lines: list[str] = []
    for kind in embedders:
        embedder = load_embedder(kind)
        own = threshold if threshold is not None else CachePolicy(embedder=SPECS[kind]).threshold
        figures: dict[str, Any] = {"model": embedder.name, "threshold": own}
        try:
            for half in halves:
                lines += [f"### Semantic cache quality ({embedder.name}, cosine >= {own}), {half} half", ""]
                part: dict[str, Any] = {}
                if data is not None and data.exists():
                    part["gptcache"] = gptcache(embedder, data, own, SWEEP, half)
                    lines += _gptcache_lines(part["gptcache"])
                for path in pair_files:
                    near, para = pairs(embedder, path, half)
                    text, part[path.name] = _pair_lines(path, near, para, own)
                    lines += text
                figures[half] = part
        finally:
            embedder.close()
        results[kind] = figures
    return "\n".join(lines) + "\n", results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, as this module's main and `tollgate cache eval` take them."""
    parser.add_argument("--threshold", type=float, help="default: each embedder's own (the policy's default)")
    parser.add_argument("--embedder", choices=("e5", "minilm", "all"), default="e5",
                        help="the embedder measured (all: each in turn)")
    parser.add_argument("--data", help="GPTCache mock_data.json (default: loadtest/data/gptcache/mock_data.json; "
                                       "'' leaves it out)")
    parser.add_argument("--pairs", nargs="+", help="near-miss/paraphrase YAML files (default: loadtest/data/"
                                                   "cache_pairs.yaml, cache_pairs_ko.yaml, cache_pairs_roles.yaml "
                                                   "and cache_pairs_roles_ko.yaml)")
    parser.add_argument("--half", choices=(*HALVES, "both"), default="both",
                        help="which half of every labelled set (split by a hash of each pair): tune on 'tuning'")
    parser.add_argument("--out", help="also write the figures as JSON here")


def run(args: argparse.Namespace) -> None:
    """Measure and print the report (and write its figures to --out)."""
    embedders = EMBEDDERS if args.embedder == "all" else (args.embedder,)
    pair_files = [Path(p) for p in args.pairs] if args.pairs else list(PAIR_FILES)
    data = None if args.data == "" else Path(args.data or GPTCACHE)
    halves = HALVES if args.half == "both" else (args.half,)
    text, results = report(args.threshold, data, pair_files, embedders, halves)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, ensure_ascii=False))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the semantic cache's quality (as tollgate cache eval)")
    add_arguments(parser)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
