"""Independent, deliberately plain re-statements of the four families as the original code bases compute them.

Written from the published architecture facts (REFERENCE.md §1), with the official parameter names, explicit
softmax attention, einsum performer, square-only reshapes and no shared code with `backbones/`. The tests export
their weights in the official file formats, load them into the suite's models and compare outputs.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn


class RefMlp(nn.Module):
    def __init__(self, dim, hidden, out=None):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out or dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class RefAttention(nn.Module):
    def __init__(self, dim, num_heads, qkv_bias):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class RefBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio, qkv_bias, eps, skip_lam=1.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = RefAttention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = RefMlp(dim, int(dim * mlp_ratio))
        self.skip_lam = skip_lam

    def forward(self, x):
        x = x + self.attn(self.norm1(x)) / self.skip_lam
        return x + self.mlp(self.norm2(x)) / self.skip_lam


class RefViT(nn.Module):
    """ViT/DeiT with a class token and a class slot in the position table; `distilled`: DeiT's distillation token
    after it (its own slot too) and head, the prediction the mean of the two heads."""

    def __init__(self, img_size, dim, depth, num_heads, mlp_ratio, num_classes, qkv_bias=True, eps=1e-6,
                 distilled=False):
        super().__init__()
        prefix = 2 if distilled else 1
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, dim, 16, 16)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        if distilled:
            self.dist_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.head_dist = nn.Linear(dim, num_classes)
        self.pos_embed = nn.Parameter(torch.randn(1, (img_size // 16) ** 2 + prefix, dim) * 0.02)
        self.blocks = nn.ModuleList([RefBlock(dim, num_heads, mlp_ratio, qkv_bias, eps) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, num_classes)
        self.distilled = distilled

    def forward(self, x):
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        prefix = [self.cls_token] + ([self.dist_token] if self.distilled else [])
        x = torch.cat([t.expand(x.shape[0], -1, -1) for t in prefix] + [x], dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        if self.distilled:
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2
        return self.head(x[:, 0])


# ---------------------------------------------------------------- LV-ViT

class RefLVViTStem(nn.Module):
    def __init__(self, dim, stem=64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, stem, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.conv2 = nn.Conv2d(stem, stem, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(stem)
        self.conv3 = nn.Conv2d(stem, stem, 3, 1, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(stem)
        self.proj = nn.Conv2d(stem, dim, 8, 8)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        x = torch.relu(self.bn3(self.conv3(x)))
        return self.proj(x)


class RefLVViT(nn.Module):
    def __init__(self, img_size, dim, depth, num_heads, num_classes, skip_lam, stem=64):
        super().__init__()
        self.patch_embed = RefLVViTStem(dim, stem)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (img_size // 16) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([RefBlock(dim, num_heads, 3.0, False, 1e-5, skip_lam) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.aux_head = nn.Linear(dim, num_classes)

    def tokens(self, x, box=None):
        """Normalised tokens; `box` = (top, left, bottom, right) MixToken box on the token grid."""
        x = self.patch_embed(x)
        if box is not None:
            top, left, bottom, right = box
            mixed = x.clone()
            mixed[:, :, top:bottom, left:right] = x.flip(0)[:, :, top:bottom, left:right]
            x = mixed
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)

    def forward(self, x):
        x = self.tokens(x)
        return self.head(x[:, 0]) + 0.5 * self.aux_head(x[:, 1:]).max(1)[0]


# ---------------------------------------------------------------- T2T-ViT

def ref_sinusoid(n_position, d_hid):
    table = np.array([[pos / np.power(10000, 2 * (j // 2) / d_hid) for j in range(d_hid)]
                      for pos in range(n_position)])
    table[:, 0::2] = np.sin(table[:, 0::2])
    table[:, 1::2] = np.cos(table[:, 1::2])
    return torch.FloatTensor(table).unsqueeze(0)


class RefPerformer(nn.Module):
    def __init__(self, dim, emb=64):
        super().__init__()
        self.emb = emb
        self.kqv = nn.Linear(dim, 3 * emb)
        self.proj = nn.Linear(emb, emb)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(emb)
        self.mlp = nn.Sequential(nn.Linear(emb, emb), nn.GELU(), nn.Linear(emb, emb), nn.Dropout(0.1))
        self.m = emb // 2
        self.w = nn.Parameter(nn.init.orthogonal_(torch.randn(self.m, emb)) * math.sqrt(self.m), requires_grad=False)

    def prm_exp(self, x):
        xd = ((x * x).sum(dim=-1, keepdim=True)).repeat(1, 1, self.m) / 2
        wtx = torch.einsum('bti,mi->btm', x.float(), self.w)
        return torch.exp(wtx - xd) / math.sqrt(self.m)

    def forward(self, x):
        x = self.norm1(x)
        k, q, v = torch.split(self.kqv(x), self.emb, dim=-1)
        kp, qp = self.prm_exp(k), self.prm_exp(q)
        D = torch.einsum('bti,bi->bt', qp, kp.sum(dim=1)).unsqueeze(dim=2)
        kptv = torch.einsum('bin,bim->bnm', v.float(), kp)
        y = torch.einsum('bti,bni->btn', qp, kptv) / (D.repeat(1, 1, self.emb) + 1e-8)
        x = v + self.proj(y)
        return x + self.mlp(self.norm2(x))


class RefTokenTransformer(nn.Module):
    def __init__(self, dim, emb=64):
        super().__init__()
        self.emb = emb
        self.scale = dim ** -0.5
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(dim, 3 * emb, bias=False)
        self.attn.proj = nn.Linear(emb, emb)
        self.norm2 = nn.LayerNorm(emb)
        self.mlp = RefMlp(emb, emb)

    def forward(self, x):
        x = self.norm1(x)
        B, N, _ = x.shape
        qkv = self.attn.qkv(x).reshape(B, N, 3, 1, self.emb).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        y = self.attn.proj((attn @ v).transpose(1, 2).reshape(B, N, self.emb))
        x = v.squeeze(1) + y
        return x + self.mlp(self.norm2(x))


class RefT2TModule(nn.Module):
    def __init__(self, tokens_type, dim, emb=64):
        super().__init__()
        layer = RefPerformer if tokens_type == 'performer' else RefTokenTransformer
        self.soft_split0 = nn.Unfold(kernel_size=(7, 7), stride=(4, 4), padding=(2, 2))
        self.soft_split1 = nn.Unfold(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))
        self.soft_split2 = nn.Unfold(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))
        self.attention1 = layer(3 * 7 * 7, emb)
        self.attention2 = layer(emb * 3 * 3, emb)
        self.project = nn.Linear(emb * 3 * 3, dim)

    def forward(self, x):
        x = self.attention1(self.soft_split0(x).transpose(1, 2))
        B, HW, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, int(np.sqrt(HW)), int(np.sqrt(HW)))
        x = self.attention2(self.soft_split1(x).transpose(1, 2))
        B, HW, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, int(np.sqrt(HW)), int(np.sqrt(HW)))
        return self.project(self.soft_split2(x).transpose(1, 2))


class RefT2TViT(nn.Module):
    def __init__(self, img_size, tokens_type, dim, depth, num_heads, mlp_ratio, num_classes):
        super().__init__()
        self.tokens_to_token = RefT2TModule(tokens_type, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(ref_sinusoid((img_size // 16) ** 2 + 1, dim), requires_grad=False)
        self.blocks = nn.ModuleList([RefBlock(dim, num_heads, mlp_ratio, False, 1e-5) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.tokens_to_token(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


# ---------------------------------------------------------------- CaiT

class RefTalkingHeads(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.proj_l = nn.Linear(num_heads, num_heads)
        self.proj_w = nn.Linear(num_heads, num_heads)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)
        attn = self.proj_l(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).softmax(dim=-1)
        attn = self.proj_w(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class RefClassAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x[:, 0]).unsqueeze(1).reshape(B, 1, h, C // h).permute(0, 2, 1, 3) * self.scale
        k = self.k(x).reshape(B, N, h, C // h).permute(0, 2, 1, 3)
        v = self.v(x).reshape(B, N, h, C // h).permute(0, 2, 1, 3)
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, 1, C))


class RefCaiTBlock(nn.Module):
    def __init__(self, dim, num_heads, init, attn):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = attn(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = RefMlp(dim, dim * 4)
        self.gamma_1 = nn.Parameter(init * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init * torch.ones(dim))

    def forward(self, x, x_cls=None):
        if x_cls is None:
            x = x + self.gamma_1 * self.attn(self.norm1(x))
            return x + self.gamma_2 * self.mlp(self.norm2(x))
        u = torch.cat((x_cls, x), dim=1)
        x_cls = x_cls + self.gamma_1 * self.attn(self.norm1(u))
        return x_cls + self.gamma_2 * self.mlp(self.norm2(x_cls))


class RefCaiT(nn.Module):
    def __init__(self, img_size, dim, depth, num_heads, num_classes, init=1e-5):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, dim, 16, 16)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, (img_size // 16) ** 2, dim) * 0.02)
        self.blocks = nn.ModuleList([RefCaiTBlock(dim, num_heads, init, RefTalkingHeads) for _ in range(depth)])
        self.blocks_token_only = nn.ModuleList([RefCaiTBlock(dim, num_heads, init, RefClassAttention)
                                                for _ in range(2)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2) + self.pos_embed
        cls_tokens = self.cls_token.expand(x.shape[0], -1, -1)
        for blk in self.blocks:
            x = blk(x)
        for blk in self.blocks_token_only:
            cls_tokens = blk(x, cls_tokens)
        return self.head(self.norm(torch.cat((cls_tokens, x), dim=1))[:, 0])


def randomize_(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every trainable parameter and every BatchNorm statistic random values, so no equality is by luck."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue  # frozen tables (T2T's sinusoid, performer directions) keep their defining values
            scale = 0.1 if p.dim() == 1 and 'norm' in name else 0.05
            base = 1.0 if name.endswith('norm1.weight') or name.endswith('norm2.weight') or name == 'norm.weight' else 0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.copy_(0.1 * torch.randn(module.running_mean.shape, generator=gen))
                module.running_var.copy_(0.5 + torch.rand(module.running_var.shape, generator=gen))
    return model.eval()
