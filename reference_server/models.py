"""The reference models, written in torch and seeded: what matters for calibration is timing,
so nothing is downloaded and the weights are a seeded random initialization.

* ``resnet``: an image classifier of the ResNet family (basic blocks, as ResNet-18/34) at a
  configurable resolution and width; it takes a JPEG, decodes and resizes it on the CPU,
  and answers the top class and its probability (the CV seed articles).
* ``ranker``: a ranking MLP over dense features and embedding lookups (the recsys seed
  articles); the sparse ids come in the request or from the Redis feature store.

Precision is fp32, fp16, bf16, or int8 (torch dynamic quantization of the linear layers,
on the CPU only).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import nn

from reference_server.protocol import TensorSpec

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.down = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.down(x))


class ResNet(nn.Module):
    """ResNet with basic blocks: ``layers`` blocks per stage, stage widths ``width`` × (1, 2, 4, 8)."""

    def __init__(self, layers=(2, 2, 2, 2), width: int = 64, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks, c = [], width
        for i, n in enumerate(layers):
            out = width * 2**i
            for j in range(n):
                blocks.append(BasicBlock(c, out, 2 if j == 0 and i > 0 else 1))
                c = out
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Ranker(nn.Module):
    """Dense features and summed embedding lookups into an MLP; one score per item."""

    def __init__(self, dense: int = 13, sparse: int = 26, vocab: int = 100_000, dim: int = 32, hidden=(512, 256, 64)):
        super().__init__()
        self.emb = nn.EmbeddingBag(vocab, dim, mode="sum")
        self.sparse = sparse
        layers, c = [], dense + dim
        for h in hidden:
            layers += [nn.Linear(c, h), nn.ReLU()]
            c = h
        self.mlp = nn.Sequential(*layers, nn.Linear(c, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        pooled = self.emb(ids)  # (batch, sparse) ids -> (batch, dim)
        return torch.sigmoid(self.mlp(torch.cat([dense, pooled.to(dense.dtype)], dim=1)))


@dataclass
class ModelConfig:
    """What to serve: the model, its size and its numerics."""

    kind: str = "resnet"  # resnet | ranker
    resolution: int = 64  # image side, pixels (resnet)
    width: int = 32  # channels of the first stage (resnet; 64 is ResNet-18)
    depth: int = 18  # 18 or 34 (resnet)
    dense: int = 13  # dense features (ranker)
    sparse: int = 26  # embedding lookups per item (ranker)
    vocab: int = 100_000  # embedding rows (ranker)
    precision: str = "fp32"
    seed: int = 0
    max_image_pixels: int = 0  # decoded pixels an image may have (0: max(2048², (16 × resolution)²))

    @property
    def name(self) -> str:
        return self.kind


class ServedModel:
    """A model ready to serve: its tensors' metadata, its CPU stages and a batch forward pass.

    ``weights=False`` builds the metadata and the CPU stages only: what the front end needs
    when the network itself runs in instance processes (:mod:`reference_server.instances`).
    """

    def __init__(self, cfg: ModelConfig, device: str | None = None, *, weights: bool = True):
        if cfg.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}")
        self.cfg = cfg
        self.inputs, self.outputs = _specs(cfg)
        self.max_pixels = cfg.max_image_pixels or max(2048**2, (16 * cfg.resolution) ** 2)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if cfg.precision == "int8" and self.device.type != "cpu":
            raise ValueError("int8 (dynamic quantization) runs on the CPU only")
        self.dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision, torch.float32)
        self.net: nn.Module | None = None
        if not weights:
            return
        with torch.random.fork_rng(devices=[]):  # seeded weights, global RNG state left as it was
            torch.manual_seed(cfg.seed)
            net = _network(cfg)
        net.eval()
        if cfg.precision == "int8":
            net = torch.ao.quantization.quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)
        else:
            net = net.to(self.device, self.dtype)
        self.net = net

    # --- the pipeline's CPU stages ---------------------------------------------------
    def preprocess(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per request, on the CPU: decode and resize images; check id ranges."""
        if self.cfg.kind == "resnet":
            return {"image": np.stack([self._decode(b) for b in inputs["image"].ravel()])}
        ids = inputs["sparse"]
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab):
            raise ValueError(f"sparse ids must lie in 0..{self.cfg.vocab - 1}")
        return {"dense": inputs["dense"], "sparse": ids}

    def _decode(self, jpeg: bytes) -> np.ndarray:
        try:
            img = Image.open(io.BytesIO(jpeg))  # reads the header only
        except Exception:  # PIL raises several types for a corrupt image
            raise ValueError("image is not a decodable JPEG/PNG") from None
        w, h = img.size
        if w * h > self.max_pixels:  # refused before the pixels are decoded (a 20 KB PNG can declare 169 MP)
            raise ValueError(f"image of {w}x{h} pixels exceeds the limit of {self.max_pixels:,} (--max-image-pixels)")
        try:
            img = img.convert("RGB")
        except Exception:
            raise ValueError("image is not a decodable JPEG/PNG") from None
        r = self.cfg.resolution
        img = img.resize((r, r), Image.BILINEAR)
        x = (np.asarray(img, dtype=np.float32) / 255.0 - _MEAN) / _STD
        return x.transpose(2, 0, 1)

    # --- the batch -------------------------------------------------------------------
    def collate(self, items: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
        """Stack preprocessed requests into one batch on the device (compute_input)."""
        return self.to_device({name: np.concatenate([it[name] for it in items]) for name in items[0]})

    def to_device(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A stacked batch as tensors on the device, in the model's precision (no copy on
        the CPU in fp32: the tensors share the arrays' memory)."""
        out = {}
        for name, arr in arrays.items():
            t = torch.from_numpy(arr).to(self.device)
            out[name] = t.to(self.dtype) if t.is_floating_point() and self.cfg.precision != "int8" else t
        return out

    @torch.inference_mode()
    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model on a batch (compute_infer)."""
        if self.net is None:
            raise RuntimeError("this model was built without weights (front end only)")
        if self.cfg.kind == "resnet":
            return torch.softmax(self.net(batch["image"]).float(), dim=1)
        return self.net(batch["dense"], batch["sparse"]).float()

    def columns(self, y: torch.Tensor) -> dict[str, np.ndarray]:
        """The batch's outputs, one row per item (compute_output): the top class and its
        probability, or the score."""
        y = y.cpu()
        if self.cfg.kind == "resnet":
            p, k = y.max(dim=1)
            return {"class": k.numpy().astype(np.int64)[:, None], "probability": p.numpy()[:, None]}
        return {"score": y.numpy()}

    def split(self, y: torch.Tensor, sizes: list[int]) -> list[dict[str, np.ndarray]]:
        """Outputs per request (compute_output)."""
        return split_columns(self.columns(y), sizes)

    def example(self, batch: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
        """Random preprocessed requests of one item each (warm-up and micro-benchmarks)."""
        items = []
        for _ in range(batch):
            if self.cfg.kind == "resnet":
                r = self.cfg.resolution
                items.append({"image": rng.standard_normal((1, 3, r, r)).astype(np.float32)})
            else:
                items.append(
                    {
                        "dense": rng.standard_normal((1, self.cfg.dense)).astype(np.float32),
                        "sparse": rng.integers(0, self.cfg.vocab, (1, self.cfg.sparse)),
                    }
                )
        return items


def split_columns(cols: dict[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]]:
    """Rows of a batch's output columns, back to the requests of ``sizes`` items each."""
    out, start = [], 0
    for n in sizes:
        out.append({name: c[start : start + n] for name, c in cols.items()})
        start += n
    return out


def _specs(cfg: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's inputs and outputs as the protocol describes them."""
    if cfg.kind == "resnet":
        if cfg.depth not in (18, 34):
            raise ValueError("resnet depth must be 18 or 34")
        return [TensorSpec("image", "BYTES", (-1, 1))], [
            TensorSpec("class", "INT64", (-1, 1)),
            TensorSpec("probability", "FP32", (-1, 1)),
        ]
    if cfg.kind == "ranker":
        return [TensorSpec("dense", "FP32", (-1, cfg.dense)), TensorSpec("sparse", "INT64", (-1, cfg.sparse))], [
            TensorSpec("score", "FP32", (-1, 1))
        ]
    raise ValueError("model kind must be resnet or ranker")


def _network(cfg: ModelConfig) -> nn.Module:
    if cfg.kind == "resnet":
        return ResNet({18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}[cfg.depth], cfg.width)
    return Ranker(cfg.dense, cfg.sparse, cfg.vocab)


def jpeg(rng: np.random.Generator, side: int = 96, quality: int = 90) -> bytes:
    """A random photo-like JPEG (smooth noise), for clients and tests."""
    small = rng.integers(0, 256, (max(side // 8, 1), max(side // 8, 1), 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((side, side), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()
