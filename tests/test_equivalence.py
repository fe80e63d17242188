"""Given the same weights, in the official file formats, the suite's models compute what the originals compute."""
from __future__ import annotations

import pytest
import torch

import backbones
from backbones import load_checkpoint
from helpers.models import save_release
from helpers.reference_models import RefCaiT, RefLVViT, RefT2TViT, RefViT, randomize_

TOL = 1e-4

# (suite name, suite kwargs, reference factory, release layout, load the EMA copy)
CASES = {
    'lvvit_s@224': ('lvvit_s', dict(num_classes=10),
                    lambda: RefLVViT(224, 384, 16, 6, 10, skip_lam=2.0), 'timm_train', False),
    'lvvit_l_stem128': ('lvvit_l', dict(img_size=96, depth=2, num_classes=10),
                        lambda: RefLVViT(96, 768, 2, 12, 10, skip_lam=3.0, stem=128), 'timm_train', True),
    't2t_vit_14@224': ('t2t_vit_14', dict(num_classes=10),
                       lambda: RefT2TViT(224, 'performer', 384, 14, 6, 3.0, 10), 'timm_train', True),
    't2t_vit_7': ('t2t_vit_7', dict(img_size=96, num_classes=10),
                  lambda: RefT2TViT(96, 'performer', 256, 7, 4, 2.0, 10), 'timm_train', False),
    't2t_vit_t_14': ('t2t_vit_t_14', dict(img_size=96, depth=3, num_classes=10),
                     lambda: RefT2TViT(96, 'transformer', 384, 3, 6, 3.0, 10), 'timm_train', False),
    'cait_xxs24@224': ('cait_xxs24_224', dict(num_classes=10),
                       lambda: RefCaiT(224, 192, 24, 4, 10), 'deit', False),
    'cait_s36': ('cait_s36_224', dict(img_size=96, depth=3, num_classes=10),
                 lambda: RefCaiT(96, 384, 3, 8, 10, init=1e-6), 'deit', False),
    'deit_s@224': ('deit_small_patch16_224', dict(num_classes=10),
                   lambda: RefViT(224, 384, 12, 6, 4.0, 10), 'deit', False),
    'deit_s_distilled': ('deit_small_distilled_patch16_224', dict(img_size=96, depth=2, num_classes=10),
                         lambda: RefViT(96, 384, 2, 6, 4.0, 10, distilled=True), 'deit', False),
    'deit_b_distilled_twin': ('vit_base_patch16_224', dict(img_size=96, depth=2, num_classes=10, distilled=True),
                              lambda: RefViT(96, 768, 2, 12, 4.0, 10, distilled=True), 'deit', False),
    'vit_b': ('vit_base_patch16_224', dict(img_size=96, depth=2, num_classes=10),
              lambda: RefViT(96, 768, 2, 12, 4.0, 10), 'plain', False),
    'vit_s_legacy': ('vit_small_patch16_legacy_224', dict(img_size=96, depth=2, num_classes=10),
                     lambda: RefViT(96, 768, 2, 8, 3.0, 10, qkv_bias=False, eps=1e-5), 'plain', False),
}


@pytest.mark.parametrize('case', list(CASES))
def test_same_outputs_as_original_from_release_file(case, tmp_path):
    name, kwargs, make_reference, layout, use_ema = CASES[case]
    reference = randomize_(make_reference())
    path = save_release(tmp_path / 'release.pth', reference.state_dict(), layout)

    model = backbones.create_model(name, **kwargs).eval()
    report = load_checkpoint(model, path, use_ema=use_ema)  # strict: every key present and of the right shape
    assert not (report.missing or report.unexpected or report.mismatched or report.resized)

    size = kwargs.get('img_size', 224)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected, actual = reference(x), model(x)
    assert (expected - actual).abs().max().item() <= TOL
    assert expected.abs().max().item() > 0.1  # the comparison is not between two near-zero outputs


def test_lvvit_mixtoken_training_forward_matches_reference_with_the_same_box(tmp_path):
    reference = randomize_(RefLVViT(64, 96, 2, 2, 7, skip_lam=2.0))
    model = backbones.create_model('lvvit_s', img_size=64, embed_dim=96, depth=2, num_heads=2, num_classes=7)
    load_checkpoint(model, save_release(tmp_path / 'r.pth', reference.state_dict(), 'plain'))
    model.train()
    for m in model.modules():  # BatchNorm in eval so that both see the same statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            m.eval()
    x = torch.randn(4, 3, 64, 64)
    torch.manual_seed(3)
    out = model.forward_train(x)  # token labeling's training forward (`forward` gives the logits in both modes)
    assert out.mix_box is not None and out.token_logits.shape == (4, 4, 4, 7)
    with torch.no_grad():
        tokens = reference.tokens(x, out.mix_box)
    assert torch.allclose(out.cls_logits, reference.head(tokens[:, 0]), atol=TOL)
    assert torch.allclose(out.token_logits.flatten(1, 2), reference.aux_head(tokens[:, 1:]), atol=TOL)
