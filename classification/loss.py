"""The token-labeling loss: L = H(cls_logits, y_cls) + beta * mean over patch tokens of H(token_logits_i, y_i)."""
from __future__ import annotations

import torch
import torch.nn as nn

from backbones.token_labeling import TokenLabelingOutput, mix_box_lambda, mix_token_grid


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_c target_c * log_softmax(logits)_c, computed in fp32."""
    return -(target * logits.float().log_softmax(dim=-1)).sum(dim=-1).mean()


def mix_targets(
        cls_target: torch.Tensor,
        token_target: torch.Tensor,
        box: tuple | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MixToken on the targets: the box of the token targets comes from sample B-1-i, as the patches did, and
    the class target mixes with lambda = the fraction of the (clipped) grid that stayed the sample's own."""
    if box is None:
        return cls_target, token_target
    lam = mix_box_lambda(box, token_target.shape[1:3])
    return lam * cls_target + (1 - lam) * cls_target.flip(0), mix_token_grid(token_target, box)


class TokenLabelingLoss(nn.Module):
    """Soft cross-entropy on the class token plus `beta` times its mean over the patch tokens.

    The default beta is 0.5, the LV-ViT paper's (its Eq. 4 and the published recipe); the reference code's
    default of 1.0 weighs the dense term as much as the class term.
    """

    def __init__(self, beta: float = 0.5) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, output: TokenLabelingOutput, cls_target: torch.Tensor, token_target: torch.Tensor) -> torch.Tensor:
        cls_target, token_target = mix_targets(cls_target, token_target, output.mix_box)
        loss = soft_cross_entropy(output.cls_logits, cls_target)
        if self.beta:
            C = output.token_logits.shape[-1]
            loss = loss + self.beta * soft_cross_entropy(output.token_logits.reshape(-1, C), token_target.reshape(-1, C))
        return loss
