"""The cache benchmarks' questions: distinct generated how-to questions, and the rephrasing that makes a stored
one a semantic (not exact) hit."""

from __future__ import annotations

import random

TOPICS = ("router", "printer", "laptop", "database", "kubernetes cluster", "python package", "git branch",
          "docker image", "web server", "vpn client", "email account", "phone", "smart tv", "password manager",
          "bluetooth speaker", "spreadsheet", "cron job", "ssh key", "dns record", "load balancer")
VERBS = ("reset", "update", "configure", "back up", "restart", "secure", "clean", "install", "monitor", "debug")


def questions(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out: set[str] = set()
    while len(out) < n:
        out.add(f"How do I {rng.choice(VERBS)} my {rng.choice(TOPICS)} number {rng.randint(1, 10**6)}?")
    return sorted(out)


def rephrase(q: str) -> str:
    return q.replace("How do I ", "How can I ", 1)
