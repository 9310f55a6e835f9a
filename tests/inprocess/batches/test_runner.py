"""A batch's lines in the ledger: the app with a data directory over an in-memory ASGI transport, a scripted worker
on loopback, and the ledger read back from its SQLite file once the app has stopped (and flushed it)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import orjson

from gateway.auth import hash_key
from gateway.http.app import create_app
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import DEMO_KEY, policy_dict
from tests.fakes import MODEL, FakeWorker, completion_json, json_of

FINAL = ("completed", "failed", "expired", "cancelled")


def line(custom_id: str, **body: Any) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}}) + b"\n"


def test_each_line_is_recorded_under_the_key_that_created_the_batch_and_its_own_tags(tmp_path: Path) -> None:
    async def main() -> None:
        async with FakeWorker(json_of(completion_json())) as worker:
            store = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy_dict([worker.url])), "test"))
            app = create_app(store, tmp_path)
            async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://gateway",  # type: ignore[arg-type]
                    headers={"authorization": f"Bearer {DEMO_KEY}"}) as client:
                content = line("plain") + line("tagged", metadata={"project": "ranker"}, user="u-17") + \
                    line("refused", metadata={"project": "a,b"})
                uploaded = (await client.post("/v1/files", files={"file": ("in.jsonl", content)},
                                              data={"purpose": "batch"})).json()
                batch = (await client.post("/v1/batches", json={
                    "input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions",
                    "completion_window": "24h"})).json()
                assert "key" not in str(batch), "the batch object shows no key"
                driver = app.app.state.batches._drivers.get(batch["id"])  # the runner's task for this batch
                if driver is not None:
                    await asyncio.wait_for(asyncio.shield(driver), 30)
                done = (await client.get(f"/v1/batches/{batch['id']}")).json()
                assert done["status"] == "completed" and done["request_counts"] == {
                    "total": 3, "completed": 2, "failed": 1}
        with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
            prompt, cached, completion = db.execute(
                "SELECT sum(coalesce(prompt_tokens, 0)), sum(coalesce(cached_tokens, 0)), "
                "sum(coalesce(completion_tokens, 0)) FROM ledger WHERE batch = ?", (batch["id"],)).fetchone()
            assert (prompt, completion) == (14, 4), "two lines answered with 7 prompt and 2 completion tokens"
            assert done["usage"] == {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                                     "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                                     "total_tokens": prompt + completion}, "the batch's usage is the ledger's"
            rows = {rid: (key, status, tags) for rid, key, status, tags in db.execute(
                "SELECT request_id, key_id, status, tags FROM ledger WHERE batch = ?", (batch["id"],))}
        key = "key-" + hash_key(DEMO_KEY)[:12]
        each = {1: (key, 200, None), 2: (key, 200, "project=ranker,user=u-17"), 3: (key, 400, None)}
        assert rows == {f"{batch['id']}-{n}": row for n, row in each.items()}, "each line as its key's request"
    asyncio.run(main())
