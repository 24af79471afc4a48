"""The graph's fixed vocabulary: node types, structural edges, relation names, reserved node names,
and which relations contradict each other."""

from __future__ import annotations

import re
from typing import Literal, get_args

NodeType = Literal["PersonaNode", "TaskNode", "StateNode", "InfoNode", "EntityNode"]
NODE_TYPES: tuple[str, ...] = get_args(NodeType)
DEFAULT_NODE_TYPE = "EntityNode"  # a node nobody typed yet; an explicit type may refine it later

EdgeStatus = Literal["active", "deleted", "superseded"]
EdgeSource = Literal["message", "tool", "auto"]
TaskState = Literal["in_progress", "paused", "done", "cancelled"]
TASK_STATES: tuple[str, ...] = get_args(TaskState)

# The seed's edge types. RELATES_TO is free to use; the other four hold the persona and the task
# chain together, so only the persona and task tools write them (a stray NEXT_TASK would fork the chain).
HAS_PERSONA = "HAS_PERSONA"
NEXT_TASK = "NEXT_TASK"
HAS_STATE = "HAS_STATE"
CONTAINS_INFO = "CONTAINS_INFO"
RELATES_TO = "RELATES_TO"
STRUCTURAL = frozenset({HAS_PERSONA, NEXT_TASK, HAS_STATE, CONTAINS_INFO})
EDGE_TYPES = (HAS_PERSONA, NEXT_TASK, HAS_STATE, CONTAINS_INFO, RELATES_TO)

# Persona edges that belong to one persona node (replaced with it).
HAS_TRAIT = "has_trait"
HAS_TONE = "has_tone"

USER = "user"  # the node of the user whose graph it is: every graph belongs to one user
AI = "AI"  # the bot; HAS_PERSONA starts here
STATE_PREFIX = "state:"  # StateNode names, so a state never collides with an entity called "done"
PERSONA_PREFIX = "persona:v"  # PersonaNode names carry their version: replacing keeps the history
DIRECT_CHAT = "_direct"  # the chat of whatever a tool writes without a chat_id (as soul_narrative does)

MAX_NAME_CHARS = 200
MAX_RELATION_CHARS = 64
_RELATION = re.compile(r"^(?:[a-z][a-z0-9]*(?:_[a-z0-9]+)*|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# Writing one relation of a pair supersedes the other between the same two nodes ("I don't like rock
# anymore" after "I like rock"); a functional relation holds one object at a time: a new value
# supersedes the old one (kept as history, with the time it stopped holding).
OPPOSITES = {
    "likes": "dislikes",
    "dislikes": "likes",
    "works_on": "stopped_working_on",
    "stopped_working_on": "works_on",
    "plans": "dropped_plan",
    "dropped_plan": "plans",
    "located_at": "left",
    "left": "located_at",
    "works_at": "no_longer_works_at",
    "no_longer_works_at": "works_at",
    "lives_in": "moved_away_from",
    "moved_away_from": "lives_in",
    "partner": "broke_up_with",
    "broke_up_with": "partner",
}
FUNCTIONAL = frozenset({"located_at", "lives_in", "works_at", "job", "partner", "age"})


def is_relation_name(name: str) -> bool:
    return 1 <= len(name) <= MAX_RELATION_CHARS and bool(_RELATION.match(name))


def check_relation(name: str) -> str:
    if not is_relation_name(name):
        raise ValueError(
            f"relation names are lower_snake_case or UPPER_SNAKE_CASE, 1 to {MAX_RELATION_CHARS} characters"
        )
    return name


def is_node_name(name: str) -> bool:
    """Whether ``name`` can name a node: no control character (a NUL no store can hold)."""
    return _CONTROL.search(name) is None


def check_name(name: str) -> str:
    if not is_node_name(name):
        raise ValueError("node names may not contain control characters or line breaks")
    return name


def canonical_name(name: str, user_id: str) -> str:
    """``user`` and ``user:<own id>`` both name the graph's user (the extractor writes ``user``)."""
    stripped = name.strip()
    lowered = stripped.lower()
    if lowered == USER or lowered == f"{USER}:{user_id.lower()}":
        return USER
    return stripped


def state_node(state: str) -> str:
    return STATE_PREFIX + state


def label(name: str, props: dict[str, object]) -> str:
    """The text a node is embedded and keyword-matched by: its name in words, plus what it describes."""
    words = name.replace("_", " ").strip()
    description = props.get("description")
    return f"{words}: {description}" if isinstance(description, str) and description else words
