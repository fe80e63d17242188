"""The token-labeling loss: L = H(cls_logits, y_cls) + dense_weight * mean over patch tokens of H(token_logits_i, y_i)
(the weight is the LV-ViT paper's beta, its Eq. 4); H is cross-entropy with soft targets. With a token participation
rate below 1 (the paper's Figure 4, left), the mean runs over that fraction of each image's tokens, drawn at random
for every image and step."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from backbones.token_head import TokenLabelingOutput, mix_box_lambda, mix_token_grid


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with class probabilities as targets, mean over rows, in fp32."""
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


def participating_tokens(batch: int, tokens: int, rate: float, device: torch.device | None = None) -> torch.Tensor:
    """A (batch, tokens) mask with round(rate * tokens) tokens (at least one) of each row drawn at random."""
    count = max(1, round(rate * tokens))
    order = torch.rand(batch, tokens, device=device).argsort(dim=1)
    return order < count  # a uniformly random rank per token: the `count` lowest ranks take part


class TokenLabelingLoss(nn.Module):
    """Soft cross-entropy on the class token plus `dense_weight` (the paper's beta) times its mean over the tokens."""

    def __init__(self, dense_weight: float = 0.5, participation: float = 1.0) -> None:
        super().__init__()
        self.dense_weight = dense_weight
        self.participation = participation

    def forward(self, output: TokenLabelingOutput, cls_target: torch.Tensor,
                token_target: torch.Tensor) -> torch.Tensor:
        cls_target, token_target = mix_targets(cls_target, token_target, output.mix_box)
        loss = soft_cross_entropy(output.cls_logits, cls_target)
        if self.dense_weight:
            B, C = output.token_logits.shape[0], output.token_logits.shape[-1]
            logits, target = output.token_logits.reshape(B, -1, C), token_target.reshape(B, -1, C)
            if self.participation < 1:
                mask = participating_tokens(B, logits.shape[1], self.participation, logits.device)
                logits, target = logits[mask], target[mask]  # the same count per image: the mean weighs them alike
            loss = loss + self.dense_weight * soft_cross_entropy(logits.reshape(-1, C), target.reshape(-1, C))
        return loss
