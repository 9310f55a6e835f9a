"""instructor in its TOOLS, JSON, MD_JSON and JSON_SCHEMA modes against the gateway, sync and async."""

from __future__ import annotations

import asyncio
import os

import instructor
import openai
from pydantic import BaseModel, Field

URL, KEY, MODEL = os.environ["TOLLGATE_URL"] + "/v1", os.environ["TOLLGATE_KEY"], os.environ["TOLLGATE_MODEL"]


class User(BaseModel):
    name: str
    age: int = Field(ge=0, le=150)
    tags: list[str] = Field(default_factory=list)


def main() -> None:
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON, instructor.Mode.MD_JSON, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(openai.OpenAI(base_url=URL, api_key=KEY, max_retries=0), mode=mode)
        user = client.chat.completions.create(model=MODEL, response_model=User, max_retries=0, messages=[
            {"role": "user", "content": "Extract: Jason is 25 years old and likes chess."}])
        assert isinstance(user, User), (mode, user)
        print(mode, user)

    async def in_async() -> User:
        client = instructor.from_openai(openai.AsyncOpenAI(base_url=URL, api_key=KEY, max_retries=0))
        return await client.chat.completions.create(model=MODEL, response_model=User, max_retries=0, messages=[
            {"role": "user", "content": "Extract: Ana is 33."}])

    assert isinstance(asyncio.run(in_async()), User)
    print("instructor: ok")


if __name__ == "__main__":
    main()
