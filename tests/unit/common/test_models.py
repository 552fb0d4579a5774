"""Unit tests of common/learn/models.py: architectures, deterministic init, flat-vector helpers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from common.learn.models import (
    MODELS,
    build_model,
    flatten_gradients,
    flatten_parameters,
    load_flat_parameters,
    num_parameters,
    share_flat_storage,
)

MNIST_SHAPE = (1, 28, 28)
CIFAR_SHAPE = (3, 32, 32)


def conv(c_in: int, c_out: int) -> int:
    return c_in * c_out * 9 + c_out


def fc(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def test_mlp_parameter_count_matches_the_paper() -> None:
    model = build_model("mlp", MNIST_SHAPE, 10, seed=0)
    assert num_parameters(model) == 784 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10 == 118_282


@pytest.mark.parametrize(("shape", "side"), [(CIFAR_SHAPE, 8), (MNIST_SHAPE, 7)])
def test_cnn_parameter_count(shape: tuple[int, int, int], side: int) -> None:
    expected = (
        conv(shape[0], 32)
        + conv(32, 32)
        + conv(32, 64)
        + conv(64, 64)
        + fc(64 * side * side, 512)
        + fc(512, 512)
        + fc(512, 10)
    )
    model = build_model("cnn", shape, 10, seed=0)
    assert num_parameters(model) == expected
    if shape == CIFAR_SHAPE:
        assert expected == 2_431_018


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("shape", [MNIST_SHAPE, CIFAR_SHAPE])
def test_forward_gives_logits(name: str, shape: tuple[int, int, int]) -> None:
    model = build_model(name, shape, 10, seed=1)
    out = model(torch.zeros(4, *shape))
    assert out.shape == (4, 10) and out.dtype == torch.float32


def test_cnn_layout_follows_the_paper() -> None:
    model = build_model("cnn", CIFAR_SHAPE, 10, seed=0)
    kinds = [type(m).__name__ for m in model.children()]
    assert kinds == [
        "Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout",
        "Conv2d", "ReLU", "Conv2d", "ReLU", "MaxPool2d", "Dropout",
        "Flatten", "Linear", "ReLU", "Dropout", "Linear", "ReLU", "Dropout", "Linear",
    ]  # fmt: skip
    assert all(m.p == 0.2 for m in model.modules() if isinstance(m, nn.Dropout))


@pytest.mark.parametrize("name", list(MODELS))
def test_init_is_deterministic_per_seed(name: str) -> None:
    a = flatten_parameters(build_model(name, MNIST_SHAPE, 10, seed=42))
    b = flatten_parameters(build_model(name, MNIST_SHAPE, 10, seed=42))
    c = flatten_parameters(build_model(name, MNIST_SHAPE, 10, seed=43))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_build_model_leaves_global_rng_untouched() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    build_model("cnn", CIFAR_SHAPE, 10, seed=5)
    assert torch.equal(torch.get_rng_state(), state)
    first = torch.rand(3)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(3), first)


def test_build_model_ignores_global_rng_state() -> None:
    torch.manual_seed(1)
    a = flatten_parameters(build_model("mlp", MNIST_SHAPE, 10, seed=7))
    torch.manual_seed(2)
    b = flatten_parameters(build_model("mlp", MNIST_SHAPE, 10, seed=7))
    assert torch.equal(a, b)


def test_flatten_order_and_copy() -> None:
    model = build_model("mlp", MNIST_SHAPE, 10, seed=0)
    flat = flatten_parameters(model)
    assert flat.dim() == 1 and flat.dtype == torch.float32
    assert flat.numel() == num_parameters(model)
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert torch.equal(flat, expected)
    assert not flat.requires_grad
    flat += 1.0  # a copy: the model is unchanged
    assert torch.equal(flatten_parameters(model), expected)


@pytest.mark.parametrize("as_numpy", [False, True])
def test_load_flat_parameters_round_trip(as_numpy: bool) -> None:
    model = build_model("cnn", MNIST_SHAPE, 10, seed=0)
    d = num_parameters(model)
    target = torch.arange(d, dtype=torch.float32) / d
    source = target.numpy().copy() if as_numpy else target.clone()
    if as_numpy:
        source.setflags(write=False)  # e.g. np.frombuffer over a received frame
    load_flat_parameters(model, source)
    assert torch.equal(flatten_parameters(model), target)
    first = next(model.parameters())
    assert torch.equal(first.detach().reshape(-1), target[: first.numel()])


def test_load_flat_parameters_rejects_wrong_length_and_dtype() -> None:
    model = build_model("mlp", MNIST_SHAPE, 10, seed=0)
    with pytest.raises(ValueError, match=r"shape \(118281,\).*118282"):
        load_flat_parameters(model, torch.zeros(118_281))
    with pytest.raises(ValueError, match="1-D vector of 118282"):
        load_flat_parameters(model, torch.zeros(2, 59_141))
    with pytest.raises(ValueError, match="float32"):
        load_flat_parameters(model, torch.zeros(118_282, dtype=torch.float64))
    with pytest.raises(ValueError, match="float32"):
        load_flat_parameters(model, np.zeros(118_282))


def test_flatten_gradients_matches_per_parameter_grads() -> None:
    model = build_model("mlp", MNIST_SHAPE, 10, seed=0)
    assert torch.equal(flatten_gradients(model), torch.zeros(num_parameters(model)))
    x = torch.randn(8, *MNIST_SHAPE, generator=torch.Generator().manual_seed(0))
    y = torch.arange(8) % 10
    nn.functional.cross_entropy(model(x), y).backward()
    grads = flatten_gradients(model)
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert grads.dtype == torch.float32 and torch.equal(grads, expected)
    assert grads.abs().sum() > 0


def test_flatten_gradients_zero_where_grad_is_none() -> None:
    model = build_model("mlp", MNIST_SHAPE, 10, seed=0)
    params = list(model.parameters())
    params[-1].grad = torch.ones_like(params[-1])
    grads = flatten_gradients(model)
    assert grads[-10:].eq(1).all() and grads[:-10].eq(0).all()


def test_build_model_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown model 'resnet'; valid: mlp, cnn"):
        build_model("resnet", MNIST_SHAPE, 10, seed=0)
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        build_model("mlp", (28, 28), 10, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 4x4"):
        build_model("cnn", (1, 3, 3), 10, seed=0)
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mlp", MNIST_SHAPE, 1, seed=0)


def test_share_flat_storage_keeps_values_and_shares_memory() -> None:
    model = build_model("mlp", MNIST_SHAPE, 10, seed=0)
    before = flatten_parameters(model)
    params, grads = share_flat_storage(model)
    assert torch.equal(params, before) and torch.equal(grads, torch.zeros_like(grads))
    params.fill_(2.0)  # the parameters are the flat vector: writing it loads them
    assert all(p.eq(2.0).all() for p in model.parameters())
    x = torch.randn(8, *MNIST_SHAPE, generator=torch.Generator().manual_seed(0))
    nn.functional.cross_entropy(model(x), torch.arange(8) % 10).backward()
    assert torch.equal(grads, flatten_gradients(model)) and grads.abs().sum() > 0



def _resnet18_count(c_in: int, classes: int) -> int:
    """ResNet-18's parameters counted from its definition: 3x3 convolutions without bias,
    a norm layer's weight and bias per channel, 1x1 shortcuts where the shape changes."""
    def conv3(a: int, b: int) -> int:
        return a * b * 9

    def norm(c: int) -> int:
        return 2 * c

    total = conv3(c_in, 64) + norm(64)
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            total += conv3(cin, cout) + norm(cout) + conv3(cout, cout) + norm(cout)
            if stage and not block:
                total += cin * cout + norm(cout)  # the 1x1 shortcut of a stride-2 block
            cin = cout
    return total + fc(512, classes)


def test_resnet18_is_the_cifar_form_with_group_norm_and_keeps_no_buffer() -> None:
    model = build_model("resnet18", CIFAR_SHAPE, 10, seed=0)
    assert num_parameters(model) == _resnet18_count(3, 10) == 11_173_962
    modules = list(model.modules())
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.MaxPool2d, nn.AdaptiveAvgPool2d))
                   for m in modules)
    norms = [m for m in modules if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 1 + 8 * 2 + 3 and all(m.num_groups == 32 for m in norms)
    stem = next(m for m in modules if isinstance(m, nn.Conv2d))
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)  # CIFAR's stem: no 7x7/2
    assert list(model.buffers()) == []  # nothing the servers would not aggregate
    # per-sample normalisation: a sample's logits do not depend on the rest of its batch
    x = torch.randn(4, *CIFAR_SHAPE)
    model.train()
    with torch.no_grad():
        assert torch.allclose(model(x)[:1], model(x[:1]), atol=1e-5)


def test_resnet18_counts_on_the_meta_device_as_built() -> None:
    from common.learn.models import count_parameters

    for shape in (CIFAR_SHAPE, MNIST_SHAPE):
        assert count_parameters("resnet18", shape, 10) == num_parameters(
            build_model("resnet18", shape, 10, seed=0)) == _resnet18_count(shape[0], 10)
