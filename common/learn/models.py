"""The paper's models and flat-vector <-> parameter helpers.

Xie, Koyejo, Gupta, *Generalized Byzantine-tolerant SGD* (ICML 2018), Sec. 6:

* MLP (MNIST): flatten -> fc 128 -> ReLU -> fc 128 -> ReLU -> fc 10.
* CNN (CIFAR-10): conv 32 -> ReLU -> conv 32 -> ReLU -> maxpool 2 -> dropout 0.2
  -> conv 64 -> ReLU -> conv 64 -> ReLU -> maxpool 2 -> dropout 0.2 -> flatten
  -> fc 512 -> ReLU -> dropout 0.2 -> fc 512 -> ReLU -> dropout 0.2 -> fc classes.

``wide`` (not the paper's) is the MLP with layers of 8192 and 512 units, 10.6M
parameters on 28x28 inputs: the model ``scripts/bench_cluster.py --model wide`` measures
the cluster with at large d.

``resnet18`` (not the paper's) is ResNet-18 (He et al., 2016) in its CIFAR form: a 3x3
first convolution of stride 1 and no max-pool, four stages of two basic blocks (64, 128,
256, 512 channels), global average pooling, one linear layer; 11.2M parameters on
CIFAR-10. Its normalisation is GroupNorm (Wu and He, 2018; 32 groups) instead of
BatchNorm: the servers aggregate the parameters only, and BatchNorm's running means and
variances are buffers that no worker would push and no server would average, so each
worker's would drift apart from the model the servers hold. GroupNorm normalises each
sample by itself and keeps no buffer. The pooling is a mean over the feature map (not
``AdaptiveAvgPool2d``, whose CUDA backward has no deterministic implementation).

All output logits; the softmax lives in the loss (cross-entropy). The paper does not name
the activation (ReLU is the natural reading) nor the padding of the 64-channel convolutions
(3x3 with padding 1 here, like the 32-channel ones).

The parameter server works on the flat float32 vector x of all parameters, in
``model.parameters()`` order: :func:`flatten_parameters`, :func:`load_flat_parameters`,
:func:`flatten_gradients`, and :func:`share_flat_storage`, which makes the parameters and
their gradients views of two such vectors (what a worker computes gradients with).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from common.conf.registry import Registry
from common.errors import ConfigError
from common.learn.seeding import derive_int_seed

if TYPE_CHECKING:
    import torch
    from torch import nn

_DROPOUT = 0.2
_WIDE = (8192, 512)  # 10.6M parameters on 28x28x1 inputs: the scaling benchmarks' model


def _mlp(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    from torch import nn

    c, h, w = input_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(c * h * w, 128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, num_classes),
    )


def _wide(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    from torch import nn

    c, h, w = input_shape
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(c * h * w, _WIDE[0]),
        nn.ReLU(),
        nn.Linear(_WIDE[0], _WIDE[1]),
        nn.ReLU(),
        nn.Linear(_WIDE[1], num_classes),
    )


def _cnn(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    from torch import nn

    c, h, w = input_shape
    if h < 4 or w < 4:
        raise ValueError(f"the CNN needs inputs of at least 4x4 (two 2x2 poolings), got {h}x{w}")
    flat = 64 * (h // 4) * (w // 4)
    return nn.Sequential(
        nn.Conv2d(c, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(_DROPOUT),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Dropout(_DROPOUT),
        nn.Flatten(),
        nn.Linear(flat, 512),
        nn.ReLU(),
        nn.Dropout(_DROPOUT),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Dropout(_DROPOUT),
        nn.Linear(512, num_classes),
    )


_RESNET_WIDTHS = (64, 128, 256, 512)
_GROUPS = 32  # GroupNorm's groups (Wu and He's default)


def _norm(channels: int) -> nn.Module:
    from torch import nn

    return nn.GroupNorm(min(_GROUPS, channels), channels)


def _basic_block(cin: int, cout: int, stride: int) -> nn.Module:
    """ResNet's basic block: two 3x3 convolutions with a shortcut (a 1x1 convolution
    where the shape changes)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.norm1 = _norm(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.norm2 = _norm(cout)
            self.shortcut = (nn.Sequential() if stride == 1 and cin == cout else
                             nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           _norm(cout)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.norm1(self.conv1(x)))
            out = self.norm2(self.conv2(out))
            return torch.relu(out + self.shortcut(x))

    return BasicBlock()


def _resnet18(input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    from torch import nn

    c = input_shape[0]

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(c, _RESNET_WIDTHS[0], 3, 1, 1, bias=False),
                                      _norm(_RESNET_WIDTHS[0]), nn.ReLU())
            blocks, cin = [], _RESNET_WIDTHS[0]
            for stage, cout in enumerate(_RESNET_WIDTHS):
                for i in range(2):
                    blocks.append(_basic_block(cin, cout, 2 if stage and not i else 1))
                    cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = self.blocks(self.stem(x))
            return self.fc(features.mean(dim=(2, 3)))  # global average pooling

    return ResNet18()


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: its name, a one-line summary and its builder (input shape,
    classes)."""

    name: str
    summary: str
    build: Callable[[tuple[int, int, int], int], nn.Module]


MODELS: Registry[ModelSpec] = Registry("model", ConfigError)
"""Every model by name (the choices of ``--model``)."""

register_model = MODELS.register
"""Add a :class:`ModelSpec` to :data:`MODELS` under its ``name``."""

register_model(ModelSpec("mlp", "the paper's MLP: fc 128 - ReLU - fc 128 - ReLU - fc classes",
                         _mlp))
register_model(ModelSpec("cnn", "the paper's CNN: 2x(conv 32) - pool - 2x(conv 64) - pool - "
                         "2x(fc 512)", _cnn))
register_model(ModelSpec("wide", "not the paper's: fc 8192 - ReLU - fc 512 - ReLU - fc "
                         "classes (10.6M parameters on 28x28 inputs), to measure the cluster "
                         "at large d", _wide))
register_model(ModelSpec("resnet18", "not the paper's: ResNet-18, CIFAR form (3x3 stem, no "
                         "max-pool), GroupNorm instead of BatchNorm (the servers aggregate "
                         "parameters only; no running statistics), 11.2M parameters on "
                         "CIFAR-10", _resnet18))


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int
) -> nn.Module:
    """The ``name`` model of :data:`MODELS` (the paper's "mlp" or "cnn", or "wide") for
    (C, H, W) inputs, float32, on CPU.

    Initialisation is torch's default, drawn from a forked CPU RNG seeded with
    ``derive_int_seed(seed, "model-init")``: the same seed gives bit-identical parameters
    and the global torch RNG state is left untouched.
    """
    import torch

    spec = MODELS[name]
    if len(input_shape) != 3 or any(int(s) < 1 for s in input_shape):
        raise ValueError(f"input_shape must be (C, H, W) with positive sizes, got {input_shape}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    shape = (int(input_shape[0]), int(input_shape[1]), int(input_shape[2]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_int_seed(seed, "model-init"))
        model = spec.build(shape, int(num_classes))
    return model.float()


@functools.cache
def count_parameters(name: str, input_shape: tuple[int, int, int], num_classes: int) -> int:
    """d of the ``name`` model on (C, H, W) inputs with ``num_classes``, counted on
    torch's meta device: nothing allocated, no data read (what a checkpoint reader and
    the deployment's memory limits need)."""
    import torch

    spec = MODELS[name]
    with torch.device("meta"):
        # a plain tuple of the three sizes (a torch.Size, say, made one)
        built = spec.build(cast("tuple[int, int, int]", tuple(input_shape)), int(num_classes))
    return num_parameters(built)


def num_parameters(model: nn.Module) -> int:
    """Number of scalar parameters d (the length of the flat vector)."""
    return sum(p.numel() for p in model.parameters())


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """A 1-D float32 copy of all parameters, in ``model.parameters()`` order."""
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def load_flat_parameters(model: nn.Module, flat: torch.Tensor | np.ndarray) -> None:
    """Copy a 1-D float32 vector (tensor or numpy array) into the model's parameters."""
    import torch

    if isinstance(flat, np.ndarray):
        if flat.dtype != np.float32:
            raise ValueError(f"flat parameters must be float32, got numpy {flat.dtype}")
        if not flat.flags.writeable:
            flat = flat.copy()  # torch.from_numpy warns on read-only buffers
        flat = torch.from_numpy(flat)
    if not isinstance(flat, torch.Tensor):
        raise ValueError(f"flat parameters must be a tensor or numpy array, got {type(flat)}")
    if flat.dtype != torch.float32:
        raise ValueError(f"flat parameters must be float32, got {flat.dtype}")
    expected = num_parameters(model)
    if flat.dim() != 1 or flat.numel() != expected:
        raise ValueError(
            f"flat parameters have shape {tuple(flat.shape)}, the model needs a 1-D vector "
            f"of {expected} values"
        )
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            k = p.numel()
            p.copy_(flat[offset : offset + k].reshape(p.shape))
            offset += k


def flatten_gradients(model: nn.Module) -> torch.Tensor:
    """A 1-D float32 vector of the parameters' ``.grad`` (zeros where it is None)."""
    import torch

    parts = [
        torch.zeros(p.numel(), dtype=torch.float32)
        if p.grad is None
        else p.grad.detach().reshape(-1).float()
        for p in model.parameters()
    ]
    return torch.cat(parts)


def share_flat_storage(model: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Make every parameter, and its ``.grad``, a view into one flat float32 vector each
    (the layout of :func:`flatten_parameters`), on the device the parameters are on;
    returns (parameters, gradients), the gradients zero. Backward accumulates into the
    gradient views: zero them (``.zero_()``, never ``zero_grad``, which would drop the
    views) before each gradient. On the CPU the two vectors are numpy's (numpy asks the
    kernel for huge pages for large arrays: a 42 MB vector faults in 21 pages, not
    10,000)."""
    import torch

    d = num_parameters(model)
    device = next(model.parameters()).device if d else torch.device("cpu")
    if device.type == "cpu":
        params = torch.from_numpy(np.empty(d, dtype=np.float32))
        grads = torch.from_numpy(np.zeros(d, dtype=np.float32))
    else:
        params = torch.empty(d, dtype=torch.float32, device=device)
        grads = torch.zeros(d, dtype=torch.float32, device=device)
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            k = p.numel()
            params[offset:offset + k].copy_(p.reshape(-1))
            p.data = params[offset:offset + k].view(p.shape)
            p.grad = grads[offset:offset + k].view(p.shape)
            offset += k
    return params, grads
