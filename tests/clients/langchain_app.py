"""LangChain's ChatOpenAI as its users use it, against the gateway: invoke, stream, async, tools, structured
output. Run by tests/process/test_client_libraries.py in .venv-clients; exits non-zero on the first failure."""

from __future__ import annotations

import asyncio
import os

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

URL, KEY, MODEL = os.environ["TOLLGATE_URL"] + "/v1", os.environ["TOLLGATE_KEY"], os.environ["TOLLGATE_MODEL"]


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """Get the current weather in a city."""
    return f"18 degrees {unit} in {city}"


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str = Field(description="the person's name")
    age: int = Field(ge=0, le=150)


async def asynchronously() -> None:
    """ainvoke and astream, as an async service calls them: its own ChatOpenAI in its own event loop (the async
    client a ChatOpenAI keeps is bound to the loop that first used it)."""
    llm = ChatOpenAI(base_url=URL, api_key=KEY, model=MODEL, max_retries=0, temperature=0.7)
    assert (await llm.ainvoke("Say hi.")).content
    assert "".join([chunk.content async for chunk in llm.astream("Count to three.")]), "the async stream was empty"
    person = await llm.with_structured_output(Person).ainvoke("Bob is 40.")
    assert isinstance(person, Person), person


def main() -> None:
    llm = ChatOpenAI(base_url=URL, api_key=KEY, model=MODEL, max_retries=0, temperature=0.7)
    answer = llm.invoke("Say hello in one sentence.")
    assert answer.content and answer.response_metadata["finish_reason"] == "stop", answer
    assert "".join(chunk.content for chunk in llm.stream("Count to five.")), "the stream carried no text"

    with_tools = llm.bind_tools([get_weather])
    called = with_tools.invoke("What is the weather in Paris?")
    assert called.tool_calls, f"no tool call: {called}"
    call = called.tool_calls[0]
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str), call
    print(get_weather.invoke(call["args"]))
    forced = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Hello there.")
    assert forced.tool_calls and forced.tool_calls[0]["name"] == "get_weather", forced
    streamed = None
    for chunk in with_tools.stream("What is the weather in Oslo?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and streamed.tool_calls, f"no streamed tool call: {streamed}"

    for method in ("function_calling", "json_schema", "json_mode"):
        person = llm.with_structured_output(Person, method=method).invoke(
            "Alice is 31 years old. Extract the person as JSON with keys name and age.")
        assert isinstance(person, Person), (method, person)
    asyncio.run(asynchronously())
    print("langchain: ok")


if __name__ == "__main__":
    main()
