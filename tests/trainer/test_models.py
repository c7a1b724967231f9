"""Model registry, architectures (parameter counts against published figures, outputs against torchvision and
against the papers' networks computed here), forward shapes, fine-tuning."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torchvision.models import video

from tests.trainer.reference_models import randomise_bn_and_head
from trainer.models import build_model, list_models, registry
from trainer.models.blocks import Bottleneck

TINY_MODELS = ["slowfast_tiny", "i3d_tiny", "slow_tiny", "r2plus1d_tiny"]


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# Kinetics-400 heads. SlowFast 8x8 is GluonCV's published 34.57M. mmaction2's metafile gives 34,479,288 for
# SlowFast R50 4x16; its laterals have no BN, PySlowFast/GluonCV's have one (2 x (16+64+128+256) = 928 more).
# I3D R50 (GluonCV i3d_resnet50_v1 inflation, 28.04M) and Slow R50 (32.45M) are counted from the same layouts.
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("slowfast_4x16_resnet50_kinetics400", 34_479_288 + 928),
        ("slowfast_8x8_resnet50_kinetics400", 34_566_488),
        ("i3d_resnet50_v1_kinetics400", 28_043_472),
        ("i3d_slow_resnet50_f8s8_kinetics400", 32_454_096),
    ],
)
def test_r50_parameter_counts_match_published_layouts(name: str, expected: int) -> None:
    assert num_params(build_model(name, 400)) == expected


def test_slowfast_8x8_is_the_published_34_57m() -> None:
    assert abs(num_params(build_model("slowfast_8x8_resnet50", 400)) / 1e6 - 34.57) < 0.01


def test_r2plus1d_v1_resnet18_is_torchvisions_r2plus1d_18() -> None:
    """GluonCV's r2plus1d_v1 is torchvision's layout: tensor for tensor (same shapes in the same order), the same
    logits from the same weights."""
    ours = build_model("r2plus1d_v1_resnet18_kinetics400", 400)
    reference = randomise_bn_and_head(video.r2plus1d_18(weights=None, num_classes=400))
    mine, theirs = ours.state_dict(), reference.state_dict()
    assert [tensor.shape for tensor in mine.values()] == [tensor.shape for tensor in theirs.values()]
    ours.load_state_dict(dict(zip(mine, theirs.values(), strict=True)))
    clip = torch.randn(1, 3, 8, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(clip), reference(clip))
    assert num_params(ours) == 31_505_325


def test_slowfast_4x16_full_model_forward_at_tiny_resolution() -> None:
    model = build_model("slowfast_4x16_resnet50", 7).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 32, 32, 32))
    assert out.shape == (1, 7)


@pytest.mark.parametrize("name", TINY_MODELS)
@pytest.mark.parametrize("clip", [(8, 32, 32), (16, 48, 48)])
def test_tiny_models_forward_and_backward(name: str, clip: tuple[int, int, int]) -> None:
    model = build_model(name, 5)
    assert 10_000 < num_params(model) < 100_000
    out = model(torch.randn(2, 3, *clip))
    assert out.shape == (2, 5)
    out.sum().backward()
    # Every parameter takes part, so DDP can run without find_unused_parameters.
    assert all(p.grad is not None for p in model.parameters())
    assert model.needs_unused_parameters is False


def test_slowfast_slow_pathway_sees_every_alpha_th_frame() -> None:
    model = build_model("slowfast_tiny", 3).eval()
    seen: list[torch.Tensor] = []
    model.slow_stem.register_forward_hook(lambda _m, args, _out: seen.append(args[0]))
    clip = torch.randn(1, 3, 16, 32, 32)
    with torch.no_grad():
        model(clip)
    assert torch.equal(seen[0], clip[:, :, :: model.alpha])


def test_init_zeroes_final_bn_and_uses_small_head() -> None:
    model = build_model("i3d_tiny", 10)
    blocks = [m for m in model.modules() if isinstance(m, Bottleneck)]
    assert len(blocks) == 4
    for block in blocks:
        assert torch.count_nonzero(block.bn_c.weight) == 0
        assert torch.all(block.bn_a.weight == 1)
    assert model.head.fc.weight.std() < 0.05
    assert torch.count_nonzero(model.head.fc.bias) == 0


def video_resnet18(state: dict[str, torch.Tensor], clip: torch.Tensor, downsample_time: bool) -> torch.Tensor:
    """Tran et al.'s 18-layer video ResNets (CVPR 2018, section 3 and Table 1), computed with torch.nn.functional
    from a state dict, independently of any model code: a stem conv (R(2+1)D: a 1x7x7 and a 3x1x1 one) halving the
    space; four stages of two basic blocks (conv, BN, ReLU, conv, BN, plus the shortcut, then ReLU) whose convs are
    3D (3x3x3), 2D (1x3x3: MC3 after res2) or (2+1)D (1x3x3, BN, ReLU, 3x1x1); res3-res5 halve the space in their
    first block, and the time too unless the network is MC3; a projection shortcut strides as its block does; global
    average pooling and the classifier. The tensors are found under torchvision's names."""

    def bn(x: torch.Tensor, at: str) -> torch.Tensor:
        return F.batch_norm(x, state[f"{at}.running_mean"], state[f"{at}.running_var"], state[f"{at}.weight"],
                            state[f"{at}.bias"], False, 0.0, 1e-5)

    def conv(x: torch.Tensor, weight: torch.Tensor, time: int, space: int) -> torch.Tensor:
        kt, kh, kw = weight.shape[2:]  # a 1x3x3 conv does not stride in time (an MC3 or (2+1)D spatial conv)
        return F.conv3d(x, weight, stride=(time if kt > 1 else 1, space, space), padding=(kt // 2, kh // 2, kw // 2))

    def factorised(x: torch.Tensor, at: str, time: int, space: int) -> torch.Tensor:
        if f"{at}.weight" in state:
            return conv(x, state[f"{at}.weight"], time, space)
        middle = F.relu(bn(conv(x, state[f"{at}.0.weight"], time, space), f"{at}.1"))
        return conv(middle, state[f"{at}.3.weight"], time, 1)

    x = clip
    for conv_at in ("stem.0", "stem.3"):
        if f"{conv_at}.weight" in state:
            space = 2 if state[f"{conv_at}.weight"].shape[-1] > 1 else 1
            x = F.relu(bn(conv(x, state[f"{conv_at}.weight"], 1, space), f"stem.{int(conv_at[-1]) + 1}"))
    for stage in range(1, 5):
        for block in range(2):
            at = f"layer{stage}.{block}"
            space = 2 if stage > 1 and block == 0 else 1
            time = space if downsample_time else 1
            out = F.relu(bn(factorised(x, f"{at}.conv1.0", time, space), f"{at}.conv1.1"))
            out = bn(factorised(out, f"{at}.conv2.0", 1, 1), f"{at}.conv2.1")
            if f"{at}.downsample.0.weight" in state:
                shortcut = F.conv3d(x, state[f"{at}.downsample.0.weight"], stride=(time, space, space))
                x = bn(shortcut, f"{at}.downsample.1")
            x = F.relu(out + x)
    return F.linear(x.mean(dim=(2, 3, 4)), state["fc.weight"], state["fc.bias"])


@pytest.mark.parametrize("name", ["r3d_18", "mc3_18", "r2plus1d_18"])
def test_torchvision_resnets_compute_the_papers_networks(name: str) -> None:
    model = randomise_bn_and_head(build_model(name, 6))
    clip = torch.randn(1, 3, 8, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = video_resnet18(model.state_dict(), clip, downsample_time=name != "mc3_18")
        torch.testing.assert_close(model(clip), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("s3d", lambda m: m.classifier[1].out_channels),
        ("mvit_v1_b", lambda m: m.head[1].out_features),
        ("mvit_v2_s", lambda m: m.head[1].out_features),
        ("swin3d_t", lambda m: m.head.out_features),
        ("swin3d_s", lambda m: m.head.out_features),
        ("swin3d_b", lambda m: m.head.out_features),
    ],
)
def test_torchvision_large_models_build_with_requested_head(name: str, head) -> None:
    # Only construction: a forward needs 16x224x224 (MViT) or is slow on CPU.
    assert head(build_model(f"torchvision_{name}", 6)) == 6


def test_gluoncv_names_and_tiny_variants_are_registered() -> None:
    names = set(list_models())
    assert {
        "slowfast_4x16_resnet50_kinetics400",
        "slowfast_8x8_resnet50_kinetics400",
        "i3d_resnet50_v1_kinetics400",
        "i3d_slow_resnet50_f8s8_kinetics400",
        "r2plus1d_v1_resnet50_kinetics400",
        "r2plus1d_v1_resnet34_kinetics400",
        *TINY_MODELS,
    } <= names
    assert build_model("SlowFast_Tiny", 2)(torch.randn(1, 3, 8, 32, 32)).shape == (1, 2)


def test_unknown_model_names_it_and_the_nearest() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'slowfast_4x16_resnet5'.*slowfast_4x16_resnet50"):
        build_model("slowfast_4x16_resnet5", 10)


def test_num_classes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        build_model("i3d_tiny", 0)


def test_duplicate_registration_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    with pytest.raises(ValueError, match="already registered"):
        registry.register_model("i3d_tiny")(lambda num_classes: nn.Linear(1, num_classes))


def test_a_new_model_file_with_a_decorator_is_buildable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    source = tmp_path / "my_model.py"
    source.write_text(
        "from torch import nn\n"
        "from trainer.models import register_model\n\n"
        "@register_model('my_pool_linear', 'my_alias')\n"
        "def build(num_classes: int, width: int = 3) -> nn.Module:\n"
        "    return nn.Sequential(nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(width, num_classes))\n"
    )
    spec = importlib.util.spec_from_file_location("my_model", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "my_model", module)
    spec.loader.exec_module(module)

    assert {"my_pool_linear", "my_alias"} <= set(list_models())
    model = build_model("my_alias", 4)
    assert model(torch.randn(2, 3, 4, 8, 8)).shape == (2, 4)
    assert model.needs_unused_parameters is False
