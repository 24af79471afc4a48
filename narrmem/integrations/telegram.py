"""The public import path of :mod:`narrmem.doors.integrations.telegram` (the same module object)."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("narrmem.doors.integrations.telegram")
