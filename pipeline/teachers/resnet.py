"""ResNet-50 image teacher (torchvision): MCSE's image encoder.

MCSE (Zhang et al., 2022, §4.1) encodes each image with a ResNet-50 pretrained on ImageNet and
keeps the 2048-d global-average-pooled output of the last block (the classifier is dropped). The
default is torchvision's ``IMAGENET1K_V1`` checkpoint (the original ResNet-50 the paper used)
with its evaluation transform: resize 256 bilinear, centre crop 224, ImageNet mean/std.
``resnet50-v2`` selects ``IMAGENET1K_V2`` (stronger, trained with a modern recipe; torchvision
evaluates it at resize 232) — not what the paper used.

``size="tiny"`` is a one-block-per-stage ResNet (BasicBlock, 512-d) on 32-px crops, random
weights only: for tests and the offline demo.
"""

from __future__ import annotations

from torch import Tensor, nn

from mmcse.errors import MmcseError
from pipeline.teachers.base import ImagePreprocess
from pipeline.teachers.runtime import ImageEncoding, WeightsInfo, seeded
from pipeline.teachers.weights import (
    load_state_dict,
    load_strict,
    torch_hub_file,
    weight_files,
    weights_kind,
    weights_sha256,
)

#: torchvision's own evaluation transform for each checkpoint
PREPROCESS = {
    "IMAGENET1K_V1": ImagePreprocess(resize=256, crop=224),
    "IMAGENET1K_V2": ImagePreprocess(resize=232, crop=224),
}
TINY_PREPROCESS = ImagePreprocess(resize=36, crop=32)


class ResNetTeacher(ImageEncoding):
    backend = "torchvision"
    image_pooling = "global_avg_pool"

    def _embed_images(self, pixels: Tensor) -> Tensor:
        return self.modules(pixels)  # fc is Identity: the avg-pooled penultimate features


def resnet_architecture(size: str) -> tuple[nn.Module, str]:
    from torchvision.models import resnet50
    from torchvision.models.resnet import BasicBlock, ResNet

    if size == "tiny":
        return ResNet(BasicBlock, [1, 1, 1, 1]), "resnet10-basic"
    return resnet50(weights=None), "resnet50"


def build_resnet(
    name: str,
    variant: str,
    weights: str = "default",
    *,
    size: str = "real",
    seed: int = 0,
    dtype=None,
) -> ResNetTeacher:
    """``name`` is the registry name; ``variant`` the torchvision checkpoint for ``"default"``."""
    from torchvision.models import ResNet50_Weights

    kind = weights_kind(weights)
    if size == "tiny" and kind == "default":
        raise MmcseError(f"{name}: size='tiny' has no published weights; use weights='random'")
    files, source = [], None
    if kind == "default":
        source = ResNet50_Weights[variant].url
        files = [torch_hub_file(source)]
    elif kind == "path":
        files, source = weight_files(weights), weights
        if len(files) != 1:
            raise MmcseError(f"{weights}: a ResNet takes one .pth or .safetensors file")
    with seeded(seed):
        net, arch = resnet_architecture(size)
    dim = net.fc.in_features
    net.fc = nn.Identity()
    if kind == "random":
        info = WeightsInfo("random", arch, "random", seed)
    else:
        state = {k: v for k, v in load_state_dict(files[0]).items() if not k.startswith("fc.")}
        load_strict(net, state, files[0])
        info = WeightsInfo(kind, source, weights_sha256(files))
    preprocess = TINY_PREPROCESS if size == "tiny" else PREPROCESS[variant]
    return ResNetTeacher(name, dim, net, info, size=size, dtype=dtype, preprocess=preprocess)
