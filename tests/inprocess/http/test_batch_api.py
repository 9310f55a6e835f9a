"""The Files and Batches endpoints in-process (the app with a data directory, over an in-memory ASGI transport):
pages of a tenant's files, what an upload or a batch must carry, and a download a browser cannot misread."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.http import batch_api
from gateway.http.app import create_app
from gateway.policy.loader import PolicySnapshot, PolicyStore
from gateway.policy.schema import Policy
from tests.conftest import DEMO_KEY, policy_dict

DEMO = {"authorization": f"Bearer {DEMO_KEY}"}
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


@asynccontextmanager
async def batch_client(data_dir: Path, **batches: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app serving the Batch API from ``data_dir`` (``batches``: the policy's batches section), started as
    uvicorn starts it (its lifespan)."""
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["batches"] = batches
    store = PolicyStore(PolicySnapshot.build(Policy.model_validate(policy), "test"))
    app = create_app(store, data_dir)
    async with app.app.router.lifespan_context(app.app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", headers=DEMO) as client:  # type: ignore[arg-type]
        yield client


async def upload(client: httpx.AsyncClient, name: str, content: bytes = LINE, purpose: str = "batch") -> Any:
    return await client.post("/v1/files", files={"file": (name, content)}, data={"purpose": purpose})


def code(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


def test_a_tenants_files_come_in_pages(tmp_path: Path) -> None:
    async def main() -> None:
        async with batch_client(tmp_path) as client:
            made = {(await upload(client, f"f{i}.jsonl")).json()["id"] for i in range(3)}
            every = [f["id"] for f in (await client.get("/v1/files?order=asc")).json()["data"]]
            assert set(every) == made
            first = (await client.get("/v1/files?limit=2&order=asc")).json()
            assert [f["id"] for f in first["data"]] == every[:2] and first["has_more"]
            assert (first["first_id"], first["last_id"]) == (every[0], every[1])
            rest = (await client.get(f"/v1/files?limit=2&order=asc&after={first['last_id']}")).json()
            assert [f["id"] for f in rest["data"]] == every[2:] and not rest["has_more"]
            newest = (await client.get("/v1/files")).json()
            assert [f["id"] for f in newest["data"]] == every[::-1], "newest first unless asked"
            for query in ("limit=0", "limit=10001", "limit=two"):
                assert code(await client.get(f"/v1/files?{query}")) == (400, "invalid_limit"), query
            assert code(await client.get("/v1/files?order=sideways")) == (400, "invalid_order")
    asyncio.run(main())


def test_an_upload_is_a_form_with_a_batch_file_that_has_something_in_it(tmp_path: Path) -> None:
    async def main() -> None:
        async with batch_client(tmp_path) as client:
            raw = await client.post("/v1/files", content=LINE, headers={"content-type": "application/jsonl"})
            assert code(raw) == (400, "invalid_content_type")
            assert code(await upload(client, "empty.jsonl", b"")) == (400, "empty_file")
            assert code(await upload(client, "x.jsonl", purpose="assistants")) == (400, "invalid_purpose")
            no_file = await client.post("/v1/files", files={"other": ("x", b"1")}, data={"purpose": "batch"})
            assert code(no_file) == (400, "missing_file")
            assert (await client.get("/v1/files")).json()["data"] == [], "nothing refused was kept"
    asyncio.run(main())


def test_an_upload_over_the_limit_is_refused_as_declared_or_as_counted(tmp_path: Path) -> None:
    async def main() -> None:
        async with batch_client(tmp_path, max_file_bytes=4096) as client:
            assert code(await upload(client, "big.jsonl", LINE * 60)) == (413, "file_too_large"), "5 KB counted"
            declared = await client.post("/v1/files", content=b"x", headers={
                "content-type": "multipart/form-data; boundary=B",
                "content-length": str(4096 + batch_api.MULTIPART_OVERHEAD + 1)})
            assert code(declared) == (413, "file_too_large"), "refused on what it says it will send"
            assert (await upload(client, "fits.jsonl", LINE * 40)).status_code == 200, "3.2 KB fits"
    asyncio.run(main())


def test_a_download_is_the_bytes_under_a_safe_name_never_sniffed(tmp_path: Path) -> None:
    """The filename is the client's own (raw in the form: a client need not escape it as httpx does)."""
    async def main() -> None:
        async with batch_client(tmp_path) as client:
            for filename, shown in ((b'in"put.jsonl', "in_put.jsonl"),
                                    ("résumé\\x\t.jsonl".encode(), "r_sum__x_.jsonl")):
                form = (b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B\r\n'
                        b'Content-Disposition: form-data; name="file"; filename="' + filename + b'"\r\n\r\n'
                        + LINE * 3 + b"\r\n--B--\r\n")
                made = await client.post("/v1/files", content=form,
                                         headers={"content-type": "multipart/form-data; boundary=B"})
                assert made.json()["filename"] == filename.decode(), "kept as given"
                reply = await client.get(f"/v1/files/{made.json()['id']}/content")
                assert reply.status_code == 200 and reply.content == LINE * 3
                assert reply.headers["content-length"] == str(len(LINE) * 3)
                assert reply.headers["content-disposition"] == f'attachment; filename="{shown}"'
                assert reply.headers["x-content-type-options"] == "nosniff"
    asyncio.run(main())


def test_a_batch_must_name_its_file_endpoint_window_and_small_metadata(tmp_path: Path) -> None:
    async def main() -> None:
        async with batch_client(tmp_path) as client:
            file_id = (await upload(client, "in.jsonl")).json()["id"]
            good = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
            for change, expected in [
                ({"input_file_id": None}, "missing_required_parameter"),
                ({"endpoint": "/v1/moderations"}, "invalid_endpoint"),
                ({"completion_window": "1h"}, "invalid_completion_window"),
                ({"metadata": {f"k{i}": "v" for i in range(17)}}, "invalid_metadata"),
                ({"metadata": {"k": "v" * 513}}, "invalid_metadata"),
                ({"metadata": {"k": 1}}, "invalid_metadata"),
                ({"input_file_id": "file-nope"}, "file_not_found"),
            ]:
                assert code(await client.post("/v1/batches", json={**good, **change})) == (400, expected), change
            assert (await client.get("/v1/batches")).json()["data"] == [], "no refused batch was made"
            assert code(await client.post("/v1/batches/batch_nope/cancel")) == (404, "batch_not_found")
            assert code(await client.get("/v1/files/file-nope")) == (404, "file_not_found")
    asyncio.run(main())
