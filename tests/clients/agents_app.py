"""openai-agents with a function tool, the model required to call it, over Chat Completions (as its users
point it at an OpenAI-compatible endpoint); streamed and not."""

from __future__ import annotations

import asyncio
import os

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

URL, KEY, MODEL = os.environ["TOLLGATE_URL"] + "/v1", os.environ["TOLLGATE_KEY"], os.environ["TOLLGATE_MODEL"]
calls: list[str] = []


@function_tool
def lookup_order(order_id: str) -> str:
    """Look up an order's status by its id."""
    calls.append(order_id)
    return f"order {order_id} shipped yesterday"


async def main() -> None:
    set_tracing_disabled(True)  # nothing leaves the machine
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=AsyncOpenAI(base_url=URL, api_key=KEY,
                                                                              max_retries=0))
    agent = Agent(name="support", instructions="Answer order questions.", model=model, tools=[lookup_order],
                  model_settings=ModelSettings(tool_choice="required"), reset_tool_choice=True)
    result = await Runner.run(agent, "Where is order 8841?", max_turns=4)
    assert calls, "the agent never called its tool"
    assert isinstance(result.final_output, str) and result.final_output, result
    calls.clear()
    streamed = Runner.run_streamed(agent, "Where is order 12?", max_turns=4)
    async for _ in streamed.stream_events():
        pass
    assert calls and streamed.final_output, "the streamed run never called its tool"
    plain = Agent(name="plain", instructions="Be brief.", model=model)
    assert (await Runner.run(plain, "Say hello.")).final_output
    print("agents: ok")


if __name__ == "__main__":
    asyncio.run(main())
