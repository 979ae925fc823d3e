"""PyTorch modules behind the exported fixtures in models/fixtures; shared by the export tool and the tests.

`make(name)` rebuilds a fixture's module with its seeded weights and its example input, so a test can
compare the ONNX file against the module without storing torch state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def _randomize_norms(module: nn.Module) -> None:
    """Give every norm layer non-trivial affine parameters and BatchNorm running statistics (global seed).

    Distinct values also keep the exporter from deduplicating equal initializers into Identity nodes.
    """
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.75, 1.25)
        if isinstance(m, nn.BatchNorm2d | nn.InstanceNorm2d | nn.LayerNorm):
            m.weight.data.uniform_(0.9, 1.1)
            m.bias.data.uniform_(-0.1, 0.1)


class BasicBlock(nn.Module):
    """ResNet's BasicBlock: two 3x3 conv-bn pairs and an identity or 1x1 projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
        return self.relu(y + self.downsample(x))


class ResNet18(nn.Module):
    """torchvision's ResNet18 layout with a configurable base width."""

    def __init__(self, width: int = 8, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = [width * 2**s for s in range(4)]
        cins = [width, *widths[:-1]]
        for s, (cin, cout) in enumerate(zip(cins, widths, strict=True)):
            stride = 1 if s == 0 else 2
            setattr(self, f"layer{s + 1}", nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class UNetBlock(nn.Sequential):
    """Twice: 3x3 conv, InstanceNorm, LeakyReLU (the XEngine paper's U-Net block)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.InstanceNorm2d(cout, affine=True),
            nn.LeakyReLU(0.01),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.InstanceNorm2d(cout, affine=True),
            nn.LeakyReLU(0.01),
        )


class UNet(nn.Module):
    """The XEngine paper's U-Net (Fig. 6): MaxPool down, ConvTranspose up, Concat skips, 1x1 head."""

    def __init__(self, depth: int = 3, width: int = 8, in_channels: int = 3, num_classes: int = 2) -> None:
        super().__init__()
        chans = [width * 2**level for level in range(depth + 1)]
        cins = [in_channels, *chans[:-2]]
        self.down = nn.ModuleList(UNetBlock(cin, cout) for cin, cout in zip(cins, chans[:-1], strict=True))
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = UNetBlock(chans[-2], chans[-1])
        self.ups = nn.ModuleList(nn.ConvTranspose2d(chans[lv + 1], chans[lv], 2, 2) for lv in reversed(range(depth)))
        self.up = nn.ModuleList(UNetBlock(2 * chans[lv], chans[lv]) for lv in reversed(range(depth)))
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for upsample, block, skip in zip(self.ups, self.up, reversed(skips), strict=True):
            x = block(torch.cat([upsample(x), skip], dim=1))
        return self.head(x)


class EncoderLayer(nn.Module):
    """A post-LayerNorm transformer encoder layer with attention written out (Linear, view, matmul, softmax)."""

    def __init__(self, d_model: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (d_model // heads) ** -0.5
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model) for _ in range(3))
        self.out_proj = nn.Linear(d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, ffn), nn.GELU(), nn.Linear(ffn, d_model))
        self.norm2 = nn.LayerNorm(d_model)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[batch, seq, d_model] -> [batch, heads, seq, head_dim]."""
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Multi-head scaled dot-product self-attention."""
        q, k, v = (self.split_heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        probs = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        return self.out_proj((probs @ v).transpose(1, 2).reshape(x.shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.ffn(x))


class Transformer(nn.Sequential):
    """A stack of encoder layers on [batch, seq, d_model] embeddings."""

    def __init__(self, layers: int = 2, d_model: int = 32, heads: int = 4) -> None:
        super().__init__(*(EncoderLayer(d_model, heads, 4 * d_model) for _ in range(layers)))


# name -> (module factory, example input shape)
SPECS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "resnet18_small": (ResNet18, (1, 3, 32, 32)),
    "unet_small": (UNet, (1, 3, 64, 64)),
    "transformer_small": (Transformer, (1, 16, 32)),
}


def make(name: str, seed: int = 0) -> tuple[nn.Module, torch.Tensor]:
    """The fixture's module in eval mode with seeded weights, and a seeded example input."""
    factory, shape = SPECS[name]
    torch.manual_seed(seed)
    module = factory()
    _randomize_norms(module)
    return module.eval(), torch.randn(shape)
