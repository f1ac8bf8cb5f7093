"""clip_preference: a CLIP-style image-text preference score (PickScore and friends).

Score = exp(logit_scale) * cos(text, image) / normalize_by, as PickScore computes it
(PickScore divides by 26; normalize_by=1 gives the raw CLIP score). The text is the prompt
the image was generated from. Weights load from a local directory only (no hub access in a
child); real PickScore weights ship without a processor, hence `processor_dir`. The env has
no PIL or torchvision, so the image processor's steps run in torch, with the same
interpolation call transformers' torchvision-backed processor makes on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scorers.base import ScoreInputError, ScoreItem, Scorer, ScoreResult, ScorerSpec
from scorers.residency import move_module, resolve_device

NAME = "clip_preference"
MODEL_FILES = ("config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
)
# weights are hashed whole, read in chunks (about 1 GB/s: seconds for PickScore's 4 GB)
CHUNK_BYTES = 8 * 2**20
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLE_MODES = {2: "bilinear", 3: "bicubic"}  # PIL codes as preprocessor_config.json stores them


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(directory: str, names: Sequence[str], weights: bool) -> dict[str, Any]:
    """Hashes of the named files and, with `weights`, of each weight file (whole, see
    `weights_digest`).

    A directory that is not there (the identity may be computed where the model is not) gets a
    marker, not an error: `load()` is where a missing model fails.
    """
    root = Path(directory)
    if not root.is_dir():
        return {"missing": str(directory)}
    found: dict[str, Any] = {}
    for path in sorted(root.iterdir()):
        if not path.is_file():
            continue
        if path.name in names:
            found[path.name] = _sha256(path.read_bytes())
        elif weights and path.name.endswith(WEIGHT_SUFFIXES):
            found[path.name] = weights_digest(path)
    return found


_DIGESTS: dict[tuple[str, int, int, int], str] = {}  # (real path, inode, size, mtime) -> sha256


def weights_digest(path: Path) -> str:
    """sha256 of the whole weight file, once per process for an unchanged file. Every byte counts: a
    fine-tune may leave a file's first and last megabytes (frozen embeddings, a frozen head) as they
    were."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            while chunk := handle.read(CHUNK_BYTES):
                digest.update(chunk)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def _square(value: Any, key: str) -> tuple[int, int]:
    """An int n -> (n, n); {"height", "width"} -> (height, width)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, value
    if isinstance(value, Mapping) and set(value) == {"height", "width"}:
        return int(value["height"]), int(value["width"])
    raise ValueError(f"{key} must be a positive int or {{'height', 'width'}}, got {value!r}")


@dataclass(frozen=True)
class ImageTransform:
    """CLIPImageProcessor's steps (resize, center crop, rescale, normalize) on uint8 HWC arrays."""

    shortest_edge: int | None  # resize the short side to this, keeping the aspect ratio
    resize_to: tuple[int, int] | None  # or resize to exactly (height, width)
    crop: tuple[int, int] | None
    mode: str
    rescale: float | None
    mean: tuple[float, ...] | None
    std: tuple[float, ...] | None

    @classmethod
    def from_dir(cls, directory: str) -> ImageTransform:
        """Read preprocessor_config.json; keys it lacks take CLIPImageProcessor's defaults."""
        path = Path(directory) / "preprocessor_config.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{NAME}: {path} is missing: the image processor config must sit with the "
                f"tokenizer; "
                "set processor_dir to a directory that has preprocessor_config.json and the "
                "tokenizer files (PickScore_v1 ships without them: use "
                "laion/CLIP-ViT-H-14-laion2B-s32B-b79K's)"
            )
        config = json.loads(path.read_text())
        try:
            return cls._parse(config)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{NAME}: {path}: {exc}") from exc

    @classmethod
    def _parse(cls, config: Mapping[str, Any]) -> ImageTransform:
        shortest, exact = None, None
        if config.get("do_resize", True):
            size = config.get("size", {"shortest_edge": 224})
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                shortest = size  # CLIP reads an int size as the shortest edge
            elif isinstance(size, Mapping) and set(size) == {"shortest_edge"}:
                shortest = int(size["shortest_edge"])
            else:
                exact = _square(size, "size")
        crop = (
            _square(config.get("crop_size", 224), "crop_size")
            if config.get("do_center_crop", True)
            else None
        )
        resample = config.get("resample", 3)
        if resample not in RESAMPLE_MODES:
            raise ValueError(f"resample {resample!r} is not supported (only 2 bilinear, 3 bicubic)")
        if crop is None and exact is None:
            raise ValueError(
                "the output size is not fixed: needs do_center_crop or a {'height', 'width'} size"
            )
        normalize = bool(config.get("do_normalize", True))
        return cls(
            shortest_edge=shortest,
            resize_to=exact,
            crop=crop,
            mode=RESAMPLE_MODES[resample],
            rescale=float(config.get("rescale_factor", 1 / 255))
            if config.get("do_rescale", True)
            else None,
            mean=tuple(float(v) for v in config.get("image_mean", OPENAI_CLIP_MEAN))
            if normalize
            else None,
            std=tuple(float(v) for v in config.get("image_std", OPENAI_CLIP_STD))
            if normalize
            else None,
        )

    @property
    def output_size(self) -> tuple[int, int]:
        size = self.crop or self.resize_to
        assert size is not None  # _parse refuses a config without either
        return size

    def batch(self, images: Sequence[np.ndarray], ids: Sequence[str]) -> Any:
        """N x 3 x H x W float32 pixel values (a torch tensor on the CPU)."""
        import torch

        return torch.stack(
            [self(image, item_id) for image, item_id in zip(images, ids, strict=True)]
        )

    def __call__(self, image: np.ndarray, item_id: str) -> Any:
        import torch

        # a copy: the input is read-only
        pixels = torch.tensor(rgb_uint8(image, item_id)).permute(2, 0, 1)[None]
        height, width = pixels.shape[-2:]
        if self.resize_to is not None:
            target = self.resize_to
        elif self.shortest_edge is not None:
            short, long = min(height, width), max(height, width)
            new_long = int(self.shortest_edge * long / short)  # truncated, as transformers does
            target = (
                (self.shortest_edge, new_long)
                if height <= width
                else (new_long, self.shortest_edge)
            )
        else:
            target = (height, width)
        if target != (height, width):
            # On uint8, as the torchvision processor does on the CPU: torch's uint8 kernel rounds
            # between its two passes like PIL, so this is within 1 level of the PIL processor
            # PickScore was trained with (the float kernel differs by up to ~17 levels on detailed
            # images).
            pixels = torch.nn.functional.interpolate(
                pixels, size=target, mode=self.mode, antialias=True, align_corners=False
            )
        if self.crop is not None:
            pixels = center_crop(pixels, self.crop)
        pixels = pixels.float()
        if self.rescale is not None:
            pixels = pixels * self.rescale
        if self.mean is not None and self.std is not None:
            mean = torch.tensor(self.mean).view(1, -1, 1, 1)
            pixels = (pixels - mean) / torch.tensor(self.std).view(1, -1, 1, 1)
        return pixels[0].contiguous()


def rgb_uint8(image: np.ndarray, item_id: str) -> np.ndarray:
    """HWC uint8 RGB: grayscale replicated, RGBA composited onto white (as transformers'
    convert_to_rgb does)."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise ScoreInputError(
            f"item {item_id!r}: image must be a uint8 array, got {getattr(image, 'dtype', image)}"
        )
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3 or image.shape[2] not in (1, 3, 4) or 0 in image.shape:
        raise ScoreInputError(
            f"item {item_id!r}: image must be HW or HWC with 1, 3 or 4 channels, got {image.shape}"
        )
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    if image.shape[2] == 4:
        alpha = image[:, :, 3:] / 255.0
        return np.round(alpha * image[:, :, :3] + (1.0 - alpha) * 255.0).astype(np.uint8)
    return image


def center_crop(pixels: Any, size: tuple[int, int]) -> Any:
    """Crop N x C x H x W to `size` about the centre, zero-padding a smaller image first
    (torchvision's rule)."""
    import torch

    crop_h, crop_w = size
    height, width = pixels.shape[-2:]
    if crop_h > height or crop_w > width:
        pad_w, pad_h = max(0, crop_w - width), max(0, crop_h - height)
        pixels = torch.nn.functional.pad(
            pixels, (pad_w // 2, (pad_w + 1) // 2, pad_h // 2, (pad_h + 1) // 2)
        )
        height, width = pixels.shape[-2:]
    top, left = int((height - crop_h) / 2.0), int((width - crop_w) / 2.0)
    return pixels[..., top : top + crop_h, left : left + crop_w]


def _require_model_dir(directory: str) -> None:
    """A clear error before from_pretrained's: which path, and what belongs there."""
    root = Path(directory)
    expected = (
        "a Hugging Face CLIP model directory: config.json plus model.safetensors (or "
        "shards, or pytorch_model.bin)"
    )
    if not root.is_dir():
        raise FileNotFoundError(
            f"{NAME}: model_dir {str(root.resolve())!r} does not exist; expected {expected}"
        )
    if not (root / "config.json").is_file() or not any(
        p.name.endswith(WEIGHT_SUFFIXES) for p in root.iterdir()
    ):
        raise FileNotFoundError(
            f"{NAME}: model_dir {str(root.resolve())!r} lacks config.json or weights; "
            f"expected {expected}"
        )


def _features(output: Any) -> Any:
    """transformers 5 returns a model output with the projected embedding as pooler_output; 4.x a
    tensor."""
    import torch

    return output if isinstance(output, torch.Tensor) else output.pooler_output


class ClipPreference(Scorer):
    """Higher when the image matches its prompt under a CLIP-style preference model (PickScore)."""

    spec = ScorerSpec(
        name=NAME,
        input_kind="image",
        required_fields=("image", "prompt"),
        terms=(NAME,),
        revision="1",
        env="embed",
        supports_offload=True,
        report_packages=("torch", "transformers"),
        diagnostics=("truncated",),
        nonsemantic_params=("batch_size",),
        requires_modules=("torch", "transformers"),
    )

    def __init__(
        self,
        model_dir: str,
        processor_dir: str | None = None,
        batch_size: int = 16,
        normalize_by: float = 26.0,
        model_revision: str | None = None,
    ) -> None:
        """`model_revision`: a label of the user's (e.g. the hub commit the weights came from), kept
        in the identity; the identity also fingerprints the files themselves."""
        for name, value in (("model_dir", model_dir), ("processor_dir", processor_dir)):
            if (value is not None or name == "model_dir") and (
                not isinstance(value, (str, os.PathLike)) or not str(value)
            ):
                raise ValueError(f"{NAME}: {name} must be a non-empty path, got {value!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{NAME}: batch_size must be a positive int, got {batch_size!r}")
        if (
            isinstance(normalize_by, bool)
            or not isinstance(normalize_by, (int, float))
            or not math.isfinite(normalize_by)
            or normalize_by <= 0
        ):
            raise ValueError(
                f"{NAME}: normalize_by must be a finite number > 0 (PickScore: 26), got "
                f"{normalize_by!r}"
            )
        if model_revision is not None and (
            not isinstance(model_revision, str) or not model_revision
        ):
            raise ValueError(
                f"{NAME}: model_revision must be a non-empty string or null, got {model_revision!r}"
            )
        self.model_dir = str(model_dir)
        self.processor_dir = str(processor_dir) if processor_dir is not None else self.model_dir
        self.batch_size = batch_size
        self.normalize_by = float(normalize_by)
        self.device = "cpu"
        self._model: Any = None
        self._tokenizer: Any = None
        self._transform: ImageTransform | None = None
        self._max_tokens = 0

    def identity_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The files, not their paths: the same weights elsewhere keep the identity, new ones change
        it."""
        effective = super().identity_params(params)
        for key in ("model_dir", "processor_dir"):
            effective.pop(key, None)
        return {
            **effective,
            "model": fingerprint(self.model_dir, MODEL_FILES, weights=True),
            "processor": fingerprint(self.processor_dir, PROCESSOR_FILES, weights=False),
        }

    def load(self, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        # what can be checked without torch first: a wrong device or directory fails fast
        self.device = resolve_device(device)
        _require_model_dir(self.model_dir)
        transform = ImageTransform.from_dir(self.processor_dir)
        processor = Path(self.processor_dir)
        if (
            not (processor / "tokenizer.json").is_file()
            and not (processor / "vocab.json").is_file()
        ):
            raise FileNotFoundError(
                f"{NAME}: no tokenizer in {str(processor.resolve())!r} (tokenizer.json or "
                f"vocab.json + merges.txt); "
                "set processor_dir to the directory with the tokenizer and preprocessor_config.json"
            )
        import torch
        from transformers import AutoTokenizer, CLIPModel

        model = CLIPModel.from_pretrained(
            self.model_dir, local_files_only=True, dtype=torch.float32
        ).eval()
        image_size = model.config.vision_config.image_size
        if transform.output_size != (image_size, image_size):
            raise ValueError(
                f"{NAME}: preprocessor_config.json in {self.processor_dir!r} makes "
                f"{transform.output_size} images, the model takes {image_size}x{image_size}: "
                f"is processor_dir the model's processor?"
            )
        self._tokenizer = AutoTokenizer.from_pretrained(self.processor_dir, local_files_only=True)
        self._max_tokens = int(model.config.text_config.max_position_embeddings)
        self._transform, self._model = transform, model

    def onload(self) -> dict[str, Any]:
        return move_module(self._model, self.device, self.device)

    def offload(self) -> dict[str, Any]:
        return move_module(self._model, "cpu", self.device)

    def score(self, items: Sequence[ScoreItem]) -> ScoreResult:
        import torch

        if self._model is None or self._transform is None:
            raise RuntimeError(f"{NAME}: score() before load()")
        prompts = [item.prompt or "" for item in items]  # None was refused (a required field)
        lengths = [len(ids) for ids in self._tokenizer(prompts, verbose=False)["input_ids"]]
        truncated = sum(length > self._max_tokens for length in lengths)
        scores: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(items), self.batch_size):
                chunk = items[start : start + self.batch_size]
                scores.extend(self._score_chunk(chunk, prompts[start : start + self.batch_size]))
        return ScoreResult(terms={NAME: scores}, diagnostics={"truncated": truncated})

    def _score_chunk(self, chunk: Sequence[ScoreItem], prompts: list[str]) -> list[float]:
        """One forward pass per tower; a prompt shared by a group's images is encoded once."""
        assert self._transform is not None
        model, device = self._model, self._model.device
        pixels = self._transform.batch(
            [item.required_image() for item in chunk], [item.id for item in chunk]
        )
        image = _features(model.get_image_features(pixel_values=pixels.to(device)))
        unique = {prompt: row for row, prompt in enumerate(dict.fromkeys(prompts))}
        tokens = self._tokenizer(
            list(unique),
            padding=True,
            truncation=True,
            max_length=self._max_tokens,
            return_tensors="pt",
        ).to(device)
        text = _features(model.get_text_features(**tokens))
        image = image / image.norm(dim=-1, keepdim=True)
        text = text / text.norm(dim=-1, keepdim=True)
        rows = text[[unique[prompt] for prompt in prompts]]
        cosine = (rows * image).sum(dim=-1)
        return (model.logit_scale.exp() * cosine / self.normalize_by).double().cpu().tolist()

    def close(self) -> None:
        self._model = None
        self._tokenizer = None
