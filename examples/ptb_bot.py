"""A Telegram bot on python-telegram-bot 22 that remembers its users with narrmem.

    pip install "narrmem[telegram]"
    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/ptb_bot.py

Every message is remembered (in ./narrmem-data); in a private chat the bot answers with a
placeholder and prints the prompt an LLM would get. ``/memory`` shows what it remembers about you,
``/forgetme`` forgets it, and when something keeps coming back it says so in the chat. In groups
the bot sees every message only with privacy mode off (BotFather, /setprivacy).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from telegram import Bot, Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from narrmem import Memory, TriggerEvent
from narrmem.integrations.telegram import NarrmemTelegram, install

TOKEN_BUDGET = 400


async def send_suggestion(bot: Bot, event: TriggerEvent) -> None:
    """A topic, mood or habit came back often enough: say so where it came up."""
    if event.chat_id is not None and event.suggestion:
        await bot.send_message(chat_id=int(event.chat_id), text=event.suggestion)


Callback = Callable[[Update, ContextTypes.DEFAULT_TYPE], Coroutine[Any, Any, None]]


def answerer(narrmem: NarrmemTelegram) -> Callback:
    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        # Answering every message in a group would be noise: this bot talks in private chats only.
        if message is None or message.chat.type != "private" or not message.text:
            return
        pack = await narrmem.context_for(update)  # the message itself is already stored, and left out
        if pack is None:
            return
        prompt = pack.render(token_budget=TOKEN_BUDGET)
        print(f"--- prompt for the LLM ---\n{prompt}\n\nUser: {message.text}\n", flush=True)
        await message.reply_text(
            f"(An LLM would answer here, knowing {len(pack.hits)} things about you. "
            "Try /memory or /forgetme.)"
        )

    return answer


async def post_init(application: Application[Any, Any, Any, Any, Any, Any]) -> None:
    # The memory is opened on the application's own event loop, which run_polling starts.
    memory = await Memory.open("narrmem-data")
    application.bot_data["memory"] = memory
    narrmem = install(
        application, memory, tenant="telegram", token_budget=TOKEN_BUDGET, on_trigger=send_suggestion
    )
    # Group 0 (the default) runs after narrmem's group -1 has stored the message.
    application.add_handler(MessageHandler(filters.TEXT & ~filters.COMMAND, answerer(narrmem)))


async def post_shutdown(application: Application[Any, Any, Any, Any, Any, Any]) -> None:
    memory = application.bot_data.get("memory")
    if isinstance(memory, Memory):
        await memory.close()


def main() -> None:
    token = os.environ.get("TELEGRAM_BOT_TOKEN")
    if not token:
        sys.exit("Set TELEGRAM_BOT_TOKEN to the token BotFather gave you.")
    logging.basicConfig(level=logging.INFO)
    application = Application.builder().token(token).post_init(post_init).post_shutdown(post_shutdown).build()
    # Edits are among Telegram's default update types; asking for all of them makes it explicit.
    application.run_polling(allowed_updates=Update.ALL_TYPES)


if __name__ == "__main__":
    main()
