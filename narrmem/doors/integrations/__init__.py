"""Ready-made narrmem wiring for bot libraries. Each module imports its library, so import the one you
use (``import narrmem`` and this package need none of them):

* :mod:`narrmem.doors.integrations.aiogram`: aiogram 3 (``pip install "narrmem[aiogram]"``)
* :mod:`narrmem.doors.integrations.discord`: discord.py 2 (``pip install "narrmem[discord]"``)
* :mod:`narrmem.doors.integrations.telegram`: python-telegram-bot 22 (``pip install "narrmem[telegram]"``)

All three remember every human message with text (user, chat, message id and date from the
platform; the speaker's display name) but commands, forwards and messages sent via an inline bot
(not the person's own words) and those of a chat that is not the bot's (a Telegram business
account's, or one the bot is a guest in), replace what an edited message left (its history is kept),
forget what deleted messages left where the platform reports deletions (Discord), hand the bot the
context for its answer with the message itself left out, pass trigger events to a callback with
the chat to answer in, and add the ``forgetme`` and ``memory`` commands.
"""
