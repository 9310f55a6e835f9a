"""LlamaIndex's OpenAILike against the gateway: chat, stream, async, predict_and_call with a tool, and
structured_predict."""

from __future__ import annotations

import asyncio
import os

from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.llms.openai_like import OpenAILike
from pydantic import BaseModel

URL, KEY, MODEL = os.environ["TOLLGATE_URL"] + "/v1", os.environ["TOLLGATE_KEY"], os.environ["TOLLGATE_MODEL"]


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the result."""
    return a * b


class Song(BaseModel):
    title: str
    year: int


def main() -> None:
    llm = OpenAILike(model=MODEL, api_base=URL, api_key=KEY, is_chat_model=True, is_function_calling_model=True,
                     context_window=8192, max_retries=0, timeout=60)
    reply = llm.chat([ChatMessage(role="user", content="Say hello.")])
    assert reply.message.content, reply
    assert "".join(r.delta or "" for r in llm.stream_chat([ChatMessage(role="user", content="Count to 3.")]))
    assert asyncio.run(llm.achat([ChatMessage(role="user", content="Hi.")])).message.content

    tool = FunctionTool.from_defaults(fn=multiply)
    answer = llm.predict_and_call([tool], "What is 6 times 7?")
    assert answer.sources and answer.sources[0].tool_name == "multiply", answer
    song = llm.structured_predict(Song, PromptTemplate("Name a song about {topic}, with its year."), topic="rain")
    assert isinstance(song, Song), song
    print("llamaindex: ok")


if __name__ == "__main__":
    main()
