"""The bot integrations' public import path (``narrmem.integrations.aiogram`` and so on). They
live with the other doors in :mod:`narrmem.doors.integrations`; these names are the same modules."""
