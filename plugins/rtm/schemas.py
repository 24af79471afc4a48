"""The RTM tools' JSON shapes: strict camelCase inputs and typed outputs.

Every input model forbids unknown fields and bounds every number, so a bad call is an
``InputError`` naming the field before any work starts. Where a tool takes ``text`` or
``treeId``, exactly one must be given (the error names ``text``); with ``treeId`` the stored tree
decides every parameter, so the handler refuses tree parameters beside it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from narrmem_plugins.rtm.theory import MAX_BRANCHING, MAX_DEPTH, MIN_BRANCHING, MIN_DEPTH
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from narrmem.models import MAX_ID_CHARS, no_nul

MAX_TEXT_CHARS = 500_000  # about 80,000 words; ``max_clauses`` bounds the tree itself
MAX_TITLE_CHARS = 200
MAX_ENSEMBLE = 10_000
MAX_TARGET = 1_000_000
TREE_ID_PATTERN = r"^rtm_[0-9a-f]{12}$"
TREE_PARAMETERS = ("maxBranchingFactor", "maxRecallDepth", "partition", "seed")


# --- inputs ---------------------------------------------------------------------------------


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


def _text_field() -> Any:
    return Field(min_length=1, max_length=MAX_TEXT_CHARS, description="the narrative")


def _title_field(default: Any = ...) -> Any:
    return Field(default, min_length=1, max_length=MAX_TITLE_CHARS, description="the narrative's title")


Branching = Field(
    default=None, ge=MIN_BRANCHING, le=MAX_BRANCHING, description="K: most children a node may have (2..10)"
)
Depth = Field(
    default=None, ge=MIN_DEPTH, le=MAX_DEPTH, description="D: deepest level, the root being 1 (1..12)"
)
Seed = Field(default=None, ge=0, le=2**63 - 1, description="seed of the random partition")
Tenant = Field(default="default", min_length=1, max_length=MAX_ID_CHARS)
TenantId = Annotated[str, AfterValidator(no_nul)]  # PostgreSQL text cannot hold NUL
OwnerId = Annotated[str | None, AfterValidator(no_nul)]


def _owner_field(whose: str) -> Any:
    return Field(
        default=None,
        min_length=1,
        max_length=MAX_ID_CHARS,
        description=f"the {whose} whose words the text holds: the tree goes with its forget (a tree of "
        "no one named goes with any forget in its tenant); with treeId, the tree must be theirs",
    )


def _language_field() -> Any:
    return Field(default="auto", description="sentence rules: en, zh, or auto (detected)")


def _segmentation_field() -> Any:
    return Field(default="auto", description="lines: one clause per line as is; prose: split; auto: detect")


class _TreeOptions(_Input):
    """Tree parameters; with a ``treeId`` they are the stored tree's and may not be given."""

    maxBranchingFactor: int | None = Branching
    maxRecallDepth: int | None = Depth
    partition: Literal["semantic", "random"] | None = Field(
        default=None, description="semantic: cut at topic shifts (default); random: the paper's model"
    )
    seed: int | None = Seed
    language: Literal["auto", "en", "zh"] = _language_field()
    segmentation: Literal["auto", "lines", "prose"] = _segmentation_field()

    @field_validator("seed")
    @classmethod
    def _seed_needs_random(cls, seed: int | None, info: ValidationInfo) -> int | None:
        if seed is not None and info.data.get("partition") in (None, "semantic"):
            raise ValueError("a seed only applies to partition 'random'")
        return seed


class CreateTreeInput(_TreeOptions):
    tenant: TenantId = Tenant
    user_id: OwnerId = _owner_field("user")
    chat_id: OwnerId = _owner_field("chat")
    text: str = _text_field()
    title: str = _title_field()
    type: str = Field(
        default="story", pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="story, conversation, essay, ..."
    )

    # Stored as text, which PostgreSQL cannot hold a NUL in (the store's error named no field).
    _title_without_nul = field_validator("title")(no_nul)


class TextOrTree(_TreeOptions):
    """``treeId`` is declared before ``text`` so that ``text``'s validator can see it: the error for
    both or neither then names ``text``."""

    tenant: TenantId = Tenant
    user_id: OwnerId = _owner_field("user")
    chat_id: OwnerId = _owner_field("chat")
    treeId: str | None = Field(default=None, pattern=TREE_ID_PATTERN, description="a stored tree")
    text: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        validate_default=True,
        description="the narrative",
    )
    title: str | None = Field(
        default=None, min_length=1, max_length=MAX_TITLE_CHARS, validate_default=True, description="its title"
    )

    @field_validator("text")
    @classmethod
    def _one_source(cls, text: str | None, info: ValidationInfo) -> str | None:
        has_tree = info.data.get("treeId") is not None
        if text is not None and has_tree:
            raise ValueError("give text or treeId, not both")
        if text is None and not has_tree and "treeId" in info.data:
            raise ValueError("give text (with title) or treeId")
        return text

    @field_validator("title")
    @classmethod
    def _title_with_text(cls, title: str | None, info: ValidationInfo) -> str | None:
        if title is None and info.data.get("text") is not None:
            raise ValueError("title is required with text")
        return no_nul(title)

    def tree_parameters_given(self) -> list[str]:
        # The language and the segmentation make a tree as K and D do (its identity): given
        # beside a treeId they were taken and ignored.
        modes = [n for n in ("language", "segmentation") if getattr(self, n) != "auto"]
        return [name for name in TREE_PARAMETERS if getattr(self, name) is not None] + modes


class TraverseInput(TextOrTree):
    traversalDepth: int = Field(ge=MIN_DEPTH, le=MAX_DEPTH, description="1 = the most abstract")


class FindDepthInput(TextOrTree):
    targetRecallLength: int = Field(ge=1, le=MAX_TARGET, description="wanted number of recall units")


class EnsembleInput(TextOrTree):
    """The text's clause count, K and D come from a stored tree when there is one: ``treeId``, or the
    tree last built for ``text`` and ``title`` when no K or D is given. ``seed`` seeds the ensemble."""

    ensembleSize: int = Field(ge=1, le=MAX_ENSEMBLE, description="number of random trees")

    @field_validator("seed")
    @classmethod
    def _seed_needs_random(cls, seed: int | None, info: ValidationInfo) -> int | None:
        return seed  # every tree of an ensemble is random: the seed is the ensemble's

    def tree_parameters_given(self) -> list[str]:
        given = [n for n in ("maxBranchingFactor", "maxRecallDepth", "partition") if getattr(self, n)]
        modes = [n for n in ("language", "segmentation") if getattr(self, n) != "auto"]
        return given + modes


# --- outputs --------------------------------------------------------------------------------


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class ScaleCheck(_Output):
    ratios: list[float]
    expectedRatios: list[float]
    settled: bool | None
    unevenDensity: bool
    unevenDepths: list[int]
    note: str


class TreeStats(_Output):
    totalNodes: int
    leafCount: int
    clauseCount: int
    depth: int
    avgBranching: float
    branching: dict[str, int] = Field(description="internal nodes by number of children")
    recallLength: dict[str, int] = Field(description="units in the recall sequence per depth")


class TreeParameters(_Output):
    maxBranchingFactor: int
    maxRecallDepth: int
    depthSuggested: bool
    partition: Literal["semantic", "random"]
    seed: int | None
    language: str
    segmentation: str
    summarizer: str
    type: str


class CreateTreeOutput(_Output):
    treeId: str
    title: str
    created: bool = Field(description="false when the same tree was already stored")
    parameters: TreeParameters
    stats: TreeStats
    compressionRatio: dict[str, float] = Field(description="recall length / clauses in the story, per depth")
    scale: ScaleCheck


class RecallUnit(_Output):
    node: int
    depth: int
    clauseStart: int
    clauseEnd: int
    leaf: bool


class TraverseOutput(_Output):
    treeId: str
    traversalDepth: int
    summaries: list[str] = Field(description="each unit's text, narrative order")
    recallSequence: list[str] = Field(description="the clause recall sequence (the same texts)")
    units: list[RecallUnit]
    retelling: str = Field(description="the summaries joined: a depth-appropriate retelling")
    recallLength: int
    leafCount: int
    clauseCount: int = Field(description="clauses in the story")
    compressionRatio: float = Field(
        description="recallLength / clauseCount: clauses recalled per clause told"
    )
    tokenCompressionRatio: float = Field(description="estimated tokens of the retelling / of the story")
    clausesPerUnit: float = Field(description="clauseCount / recallLength")


class SearchStep(_Output):
    depth: int
    recallLength: int


class FindDepthOutput(_Output):
    treeId: str
    targetRecallLength: int
    optimalDepth: int
    actualRecallLength: int
    accuracy: float = Field(description="max(0, 1 - |actual - target| / target)")
    estimatedDepth: int
    searched: list[SearchStep]


class DepthStats(_Output):
    depth: int
    recallLengthMean: float
    recallLengthStd: float
    recallLengthSem: float
    recallLengthMin: int
    recallLengthMax: int
    compressionRatioMean: float
    compressionRatioStd: float
    theoryRecallLength: float
    theoryCompressionRatio: float
    zScore: float | None
    ratioToPrevious: float | None
    theoryRatio: float | None


class NodeStats(_Output):
    totalNodesMean: float
    totalNodesStd: float
    leafCountMean: float
    leafCountStd: float
    avgBranchingMean: float
    avgBranchingStd: float


class EnsembleOutput(_Output):
    title: str
    trees: list[str] = Field(
        description="stored trees whose clauses, K and D the ensemble used (empty: the request's or the "
        "defaults)"
    )
    parameterSource: Literal["tree", "request", "defaults"]
    leafCount: int = Field(description="clauses of the text: the leaves of an unlimited tree")
    ensembleSize: int
    maxBranchingFactor: int
    maxRecallDepth: int
    seed: int
    depths: list[DepthStats]
    nodes: NodeStats
    scale: ScaleCheck
    maxAbsZScore: float
