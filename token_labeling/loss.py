"""The token-labeling loss: L = H(cls_logits, y_cls) + dense_weight * mean over patch tokens of H(token_logits_i, y_i)
(the weight is the LV-ViT paper's beta, its Eq. 4); H is cross-entropy with soft targets."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from backbones.token_head import TokenLabelingOutput, mix_box_lambda, mix_token_grid


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over rows of -sum_c target_c * log_softmax(logits)_c: PyTorch's cross-entropy with class
    probabilities as targets, in fp32."""
    return F.cross_entropy(logits.float(), target.float())


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
    """Soft cross-entropy on the class token plus `dense_weight` times its mean over the patch tokens.

    The default 0.5 is the LV-ViT paper's beta (its Eq. 4 and the published recipe); the reference code's
    default of 1.0 weighs the dense term as much as the class term.
    """

    def __init__(self, dense_weight: float = 0.5) -> None:
        super().__init__()
        self.dense_weight = dense_weight

    def forward(self, output: TokenLabelingOutput, cls_target: torch.Tensor,
                token_target: torch.Tensor) -> torch.Tensor:
        cls_target, token_target = mix_targets(cls_target, token_target, output.mix_box)
        loss = soft_cross_entropy(output.cls_logits, cls_target)
        if self.dense_weight:
            C = output.token_logits.shape[-1]
            loss = loss + self.dense_weight * soft_cross_entropy(output.token_logits.reshape(-1, C),
                                                                 token_target.reshape(-1, C))
        return loss
