"""narrmem: memory middleware for chatbots. Let the AI remember who you are, not what you said."""

from narrmem.clock import Clock, ManualClock, SystemClock
from narrmem.config import Settings, load_settings, plugin_options
from narrmem.errors import (
    ClockBehindError,
    ClosedError,
    ConfigError,
    InputError,
    ModelProcessError,
    NarrmemError,
    PluginError,
    StoreError,
    StoreUnavailableError,
    UnknownToolError,
)
from narrmem.host import hookimpl
from narrmem.memory import Memory
from narrmem.models import (
    Candidate,
    ContextLine,
    ContextPack,
    Hit,
    IngestResult,
    MemoryRecord,
    Message,
    PatternCount,
    RecallRequest,
    SceneDraft,
    Scope,
    TriageDecision,
    TriggerEvent,
)
from narrmem.tools import Tool

__all__ = [
    "Candidate",
    "Clock",
    "ClockBehindError",
    "ClosedError",
    "ConfigError",
    "ContextLine",
    "ContextPack",
    "Hit",
    "IngestResult",
    "InputError",
    "ManualClock",
    "Memory",
    "MemoryRecord",
    "Message",
    "ModelProcessError",
    "NarrmemError",
    "PatternCount",
    "PluginError",
    "RecallRequest",
    "SceneDraft",
    "Scope",
    "Settings",
    "StoreError",
    "StoreUnavailableError",
    "SystemClock",
    "Tool",
    "TriageDecision",
    "TriggerEvent",
    "UnknownToolError",
    "hookimpl",
    "load_settings",
    "plugin_options",
]
__version__ = "0.1.0"
