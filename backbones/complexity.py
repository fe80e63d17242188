"""Parameter and MAC counts, measured by running the model on the meta device (no memory, no compute)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from backbones.registry import create_model, families


@dataclass(frozen=True)
class Complexity:
    params: int  # every parameter, the fixed tables (buffers) included, as the papers count them
    trainable_params: int
    macs: int  # multiply-accumulates of one forward pass of one image in eval mode

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def measure_complexity(name: str, img_size: int | None = None, **model_kwargs) -> Complexity:
    """Count a registered model's parameters and its MACs at `img_size` (default: the model's own)."""
    if img_size is not None:
        model_kwargs['img_size'] = img_size
    with torch.device('meta'):
        model = create_model(name, **model_kwargs)
    params = sum(p.numel() for p in model.parameters()) + fixed_table_size(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    size = img_size or model.pretrained_cfg['input_size'][-1]
    model.eval().requires_grad_(False)  # autograd hooks of the counter do not work on meta leaves
    image = torch.zeros(1, model_kwargs.get('in_chans', 3), size, size, device='meta')
    return Complexity(params, trainable, forward_macs(lambda: model(image)))


def forward_macs(forward: Callable[[], object]) -> int:
    """Multiply-accumulates of `forward()` on meta tensors by torch's FLOP counter, attention's products included."""
    # torch's counter knows no formula for the fused CPU attention kernel: count the math form, same MACs.
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        forward()
    return counter.get_total_flops() // 2


def fixed_table_size(model: nn.Module) -> int:
    """Elements of the fixed tables a model keeps as buffers (T2T-ViT's), which the papers count as weights."""
    statistics = {id(b) for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase) for b in m.buffers()}
    buffers = {id(b) for b in model.buffers()}
    return sum(t.numel() for t in model.state_dict(keep_vars=True).values() if id(t) in buffers - statistics)


def model_table(img_size: int | None = None) -> str:
    """Every suite model's counts, family by family, at `img_size` (default: each model's own)."""
    rows = [f"{'family':<8} {'model':<30} {'params (M)':>11} {'trainable (M)':>14} {'GMACs':>8}"]
    for family, names in families().items():
        for name in names:
            info = measure_complexity(name, img_size)
            rows.append(f'{family.name:<8} {name:<30} {info.params / 1e6:>11.2f} {info.trainable_params / 1e6:>14.2f} '
                        f'{info.macs / 1e9:>8.2f}')
    return '\n'.join(rows)
