"""torchvision's model families and the inputs each takes.

``configs/torchvision.toml`` lists every torchvision model (quantized ones
excluded) with its usual input; tests/test_zoo_forward.py audits each one. The
inputs that ``--input`` cannot spell are here, as ``--example-inputs`` targets:

- :func:`detection_images`: detection models take a list of 3-D images
  (``placecheck audit torchvision.models.detection:fasterrcnn_resnet50_fpn
  --arg weights_backbone=none --example-inputs placecheck.model.zoo:detection_images``);
- :func:`flow_frames`: optical-flow models (RAFT) take two frames.

:func:`family_inputs` is what input inference (:mod:`placecheck.model.inputs`, the
layer above) uses for a torchvision model: the family is told by the module
that defines the model's class, so nothing here imports torchvision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch.nn as nn

_TV = "torchvision.models."

CLASSIFICATION_SIZE = 224
"""Image side for classification and segmentation (ImageNet's crop)."""
INCEPTION_SIZE = 299
"""Inception v3's native side (it also runs at 224, but 299 is what it was built for)."""
VIDEO_CLIP = (16, 112, 112)
"""Frames, height, width of a video clip: what r3d/mc3/r2plus1d/swin3d accept."""
FULL_CLIP = (16, 224, 224)
"""For MViT (its positional embeddings fix the clip) and S3D (its final 2x7x7 pooling needs 224)."""
DETECTION_SIZES = ((320, 320), (288, 352))
"""Two images of different sizes: detection models batch them themselves."""
FLOW_SIZE = (128, 128)
"""RAFT needs sides divisible by 8; 128 keeps its correlation volume small."""


def detection_images() -> list[Any]:
    """A list of two 3-D RGB images in [0, 1], as torchvision's detection models take them."""
    import torch

    return [torch.rand(3, h, w) for h, w in DETECTION_SIZES]


def flow_frames() -> tuple[Any, Any]:
    """Two consecutive frames ``[1, 3, H, W]`` in [-1, 1], as RAFT takes them."""
    import torch

    return tuple(torch.rand(1, 3, *FLOW_SIZE) * 2 - 1 for _ in range(2))  # type: ignore[return-value]


def torchvision_family(model: nn.Module) -> tuple[str, str] | None:
    """``(family, class name)`` of a torchvision model (or a subclass of one); ``None`` otherwise.

    Families: classification, detection, segmentation, video, optical_flow, quantization.
    """
    for cls in type(model).__mro__:
        module = cls.__module__
        if not module.startswith(_TV):
            continue
        sub = module[len(_TV):].split(".")[0]
        family = sub if sub in ("detection", "segmentation", "video", "optical_flow",
                                "quantization") else "classification"
        return family, cls.__name__
    return None


def family_inputs(model: nn.Module) -> tuple[tuple[Any, ...], dict[str, Any], str] | None:
    """The usual input of a torchvision model's family, with whose input it is ("torchvision's
    classification models (ResNet)"); ``None`` if not one."""
    found = torchvision_family(model)
    if found is None:
        return None
    family, cls_name = found
    import torch

    args: tuple[Any, ...]
    if family == "detection":
        args = (detection_images(),)
    elif family == "optical_flow":
        args = flow_frames()
    elif family == "video":
        clip = FULL_CLIP if cls_name in ("MViT", "S3D") else VIDEO_CLIP
        args = (torch.randn(2, 3, *clip),)
    else:  # classification (quantized models are classifiers too) and segmentation
        side = CLASSIFICATION_SIZE
        if cls_name == "VisionTransformer":
            side = int(getattr(model, "image_size", side))  # its position embedding fixes it
        elif cls_name in ("Inception3", "QuantizableInception3"):
            side = INCEPTION_SIZE
        args = (torch.randn(2, 3, side, side),)
    return args, {}, f"torchvision's {family.replace('_', ' ')} models ({cls_name})"
