"""Build the ONNX graph of a BERT encoder (all-MiniLM-L6-v2 and its kin) straight from its
``model.safetensors``, without torch.

The graph is the one ``torch.onnx.export`` traced from transformers' ``BertModel``: the same inputs
(``input_ids``, ``attention_mask``, ``token_type_ids``; int64, batch x tokens), the same output
(``last_hidden_state``, batch x tokens x hidden) and the same operations in the same order
(embeddings summed word + token type, then position; layer norms; attention with the scale split
between queries and keys; exact GELU through ``Erf``), so its vectors match sentence-transformers'
to float32 rounding. Pooling and normalization stay outside the graph, in the embedder.

The weights are read with ``safetensors.numpy`` (a small package with no torch dependency) and
written with ``onnx.helper``; the file is opset 17, IR version 8, which onnxruntime 1.17 and later
load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from narrmem_plugins.onnx_runner import INPUTS

from narrmem.errors import ConfigError

OPSET = 17
IR_VERSION = 8
OUTPUT = "last_hidden_state"


def build_bert_onnx(model_dir: Path) -> Any:
    """The encoder in ``model_dir`` (``config.json`` + ``model.safetensors``) as an ``onnx.ModelProto``."""
    from onnx import TensorProto, helper
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    _check_supported(config)
    weights = {
        _strip_prefix(name): array for name, array in load_file(model_dir / "model.safetensors").items()
    }
    graph = _GraphBuilder(weights, eps=float(config["layer_norm_eps"]))
    hidden = graph.embeddings()
    mask_bias = graph.attention_mask_bias()
    heads = int(config["num_attention_heads"])
    for layer in range(int(config["num_hidden_layers"])):
        hidden = graph.encoder_layer(f"encoder.layer.{layer}", hidden, mask_bias, heads)
    graph.node("Identity", [hidden], [OUTPUT])
    dims = ["batch", "tokens"]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, dims) for name in INPUTS]
    output = helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [*dims, int(config["hidden_size"])])
    onnx_graph = helper.make_graph(
        graph.nodes, "bert_last_hidden_state", inputs, [output], graph.initializers
    )
    model = helper.make_model(
        onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="narrmem"
    )
    model.ir_version = IR_VERSION
    return model


def _check_supported(config: dict[str, Any]) -> None:
    """Only what this builder reproduces: anything else would give silently different vectors."""
    expected = {"model_type": "bert", "hidden_act": "gelu", "position_embedding_type": "absolute"}
    for key, value in expected.items():
        if config.get(key, value) != value:
            raise ConfigError(f"embedder.model_path: config.json {key}={config.get(key)!r}, not {value!r}")


def _strip_prefix(name: str) -> str:
    # Some checkpoints save BertModel's tensors under "bert." (from a task model).
    return name.removeprefix("bert.")


class _GraphBuilder:
    """Nodes and initializers of one graph, with unique names for intermediate values."""

    def __init__(self, weights: dict[str, np.ndarray], *, eps: float) -> None:
        self.weights = weights
        self.eps = eps
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._named: set[str] = set()
        self._count = 0

    def node(self, op: str, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> str:
        from onnx import helper

        self._count += 1
        outputs = outputs or [f"{op.lower()}_{self._count}"]
        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{op}_{self._count}", **attrs))
        return str(outputs[0])

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        if name in self._named:  # shared by every layer
            return name
        self._named.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def weight(self, name: str, *, transpose: bool = False) -> str:
        value = self.weights[name]
        return self.constant(f"{name}.T" if transpose else name, value.T if transpose else value)

    def linear(self, prefix: str, x: str) -> str:
        product = self.node("MatMul", [x, self.weight(f"{prefix}.weight", transpose=True)])
        return self.node("Add", [self.weight(f"{prefix}.bias"), product])

    def layer_norm(self, prefix: str, x: str) -> str:
        scale, bias = self.weight(f"{prefix}.weight"), self.weight(f"{prefix}.bias")
        return self.node("LayerNormalization", [x, scale, bias], axis=-1, epsilon=self.eps)

    def embeddings(self) -> str:
        words = self.node("Gather", [self.weight("embeddings.word_embeddings.weight"), "input_ids"])
        types = self.node(
            "Gather", [self.weight("embeddings.token_type_embeddings.weight"), "token_type_ids"]
        )
        tokens = self.node("Shape", ["input_ids"], start=1, end=2)  # 1-D: what Slice takes
        zero = self.constant("zero", np.array([0], dtype=np.int64))
        table = self.weight("embeddings.position_embeddings.weight")
        placed = self.node("Slice", [table, zero, tokens, zero])  # positions 0 .. tokens-1
        summed = self.node("Add", [self.node("Add", [words, types]), placed])
        return self.layer_norm("embeddings.LayerNorm", summed)

    def attention_mask_bias(self) -> str:
        """0 where a key may be attended, the float32 minimum where it is padding; batch x 1 x 1 x keys."""
        axes = self.constant("mask_axes", np.array([1, 2], dtype=np.int64))
        allowed = self.node("Cast", [self.node("Unsqueeze", ["attention_mask", axes])], to=9)  # bool
        open_, closed = np.array(0.0, np.float32), np.array(np.finfo(np.float32).min, np.float32)
        return self.node(
            "Where", [allowed, self.constant("mask_open", open_), self.constant("mask_closed", closed)]
        )

    def encoder_layer(self, prefix: str, x: str, mask_bias: str, heads: int) -> str:
        attended = self.self_attention(f"{prefix}.attention.self", x, mask_bias, heads)
        projected = self.linear(f"{prefix}.attention.output.dense", attended)
        x = self.layer_norm(f"{prefix}.attention.output.LayerNorm", self.node("Add", [projected, x]))
        inner = self.gelu(self.linear(f"{prefix}.intermediate.dense", x))
        out = self.linear(f"{prefix}.output.dense", inner)
        return self.layer_norm(f"{prefix}.output.LayerNorm", self.node("Add", [out, x]))

    def self_attention(self, prefix: str, x: str, mask_bias: str, heads: int) -> str:
        hidden = self.weights[f"{prefix}.query.weight"].shape[0]
        head_size = hidden // heads
        split = self.constant(f"{prefix}.split", np.array([0, 0, heads, head_size], dtype=np.int64))
        merge = self.constant(f"{prefix}.merge", np.array([0, 0, hidden], dtype=np.int64))
        # As torch's scaled_dot_product_attention exports: each side scaled by head_size ** -0.25.
        root_scale = self.constant(
            f"{prefix}.root_scale", np.array(1 / math.sqrt(math.sqrt(head_size)), np.float32)
        )

        def heads_of(name: str, perm: list[int]) -> str:
            per_head = self.node("Reshape", [self.linear(f"{prefix}.{name}", x), split])
            return self.node("Transpose", [per_head], perm=perm)

        query = self.node("Mul", [heads_of("query", [0, 2, 1, 3]), root_scale])
        key = self.node("Mul", [heads_of("key", [0, 2, 3, 1]), root_scale])
        value = heads_of("value", [0, 2, 1, 3])
        scores = self.node("Add", [self.node("MatMul", [query, key]), mask_bias])
        weights = self.node("Softmax", [scores], axis=-1)
        context = self.node("Transpose", [self.node("MatMul", [weights, value])], perm=[0, 2, 1, 3])
        return self.node("Reshape", [context, merge])

    def gelu(self, x: str) -> str:
        """Exact GELU, x * 0.5 * (1 + erf(x / sqrt(2))), in the order torch exports it."""
        root_two = self.constant("gelu_root_two", np.array(math.sqrt(2.0), np.float32))
        one, half = (
            self.constant("gelu_one", np.array(1.0, np.float32)),
            self.constant("gelu_half", np.array(0.5, np.float32)),
        )
        erf = self.node("Erf", [self.node("Div", [x, root_two])])
        return self.node("Mul", [self.node("Mul", [x, self.node("Add", [erf, one])]), half])
