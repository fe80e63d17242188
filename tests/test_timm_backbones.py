"""Any plain timm ViT as the dense backbone (DINOv2 with register tokens, DeiT III, EVA-02, BEiT): its maps against
timm's own `forward_intermediates`, the stride-16 resampling of 14 px patches, a fixed-grid model's padding, the
pretrained position table resampled on loading, and the refusals of models that are not plain ViTs."""
from __future__ import annotations

import re

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import resample_abs_pos_embed

import backbones.dense  # noqa: F401  (registration)
from backbones.common.errors import UsageError
from backbones.dense.backbone import TokenBackbone
from helpers.commands import one_line_error, run_tool

TINY = dict(embed_dim=32, depth=3, num_heads=2)
DINOV2 = 'vit_small_patch14_reg4_dinov2'


def backbone_and_timm_model(name: str, img_size: int = 112, **kwargs) -> tuple[TokenBackbone, torch.nn.Module]:
    """The dense backbone of `name` and timm's own model with the same weights (eval mode)."""
    torch.manual_seed(0)
    backbone = TokenBackbone(name, out_indices=(1, 2), img_size=img_size, model_kwargs={**TINY, **kwargs}).eval()
    own = timm.create_model(name, img_size=img_size, num_classes=0, **TINY, **kwargs,
                            **({} if name.startswith('beit') else {'dynamic_img_size': True})).eval()
    own.load_state_dict(backbone.model.state_dict(), strict=False)  # the backbone is pruned of its last norm
    return backbone, own


@pytest.mark.parametrize('name', ['deit3_small_patch16_224', 'eva02_tiny_patch14_224', DINOV2])
def test_maps_are_timms_intermediates_on_the_stride_16_grid(name):
    """At 224 px (16 x 14): a 16 px model's maps are timm's exactly; a 14 px model's (16 x 16 tokens) are timm's
    resampled bilinearly onto the 14 x 14 cells of stride 16, prefix tokens (class, registers) dropped."""
    backbone, own = backbone_and_timm_model(name)
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        maps = backbone(images)
        native = own.forward_intermediates(images, [1, 2], intermediates_only=True)
    for ours, theirs in zip(maps, native):
        assert ours.shape == (2, 32, 14, 14)
        expected = theirs if theirs.shape[-1] == 14 else F.interpolate(theirs, size=(14, 14), mode='bilinear')
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    if backbone.patch_size == 14:
        assert native[0].shape[-1] == 16  # the comparison above did resample


def test_an_image_of_any_size_is_padded_to_whole_patches_and_its_extent_resampled():
    """A 100 x 70 image: DINOv2 reads it padded to 112 x 70 (8 x 5 patches of 14 px); the maps are the top-left
    100/112 x 70/70 of timm's, on ceil(100/16) x ceil(70/16) = 7 x 5 cells."""
    backbone, own = backbone_and_timm_model(DINOV2)
    images = torch.randn(1, 3, 100, 70)
    with torch.no_grad():
        (first, _) = backbone(images)
        (native, _) = own.forward_intermediates(F.pad(images, (0, 0, 0, 12)), [1, 2], intermediates_only=True)
    assert native.shape[-2:] == (8, 5) and first.shape[-2:] == (7, 5)
    # the top-left 100/112 of the 8 rows, sampled at 7 cell centres: rows at (i + 0.5) * 100/7 px of the image
    rows = (torch.arange(7) + 0.5) * (100 / 7) / 14 - 0.5  # in native cell coordinates
    cols = (torch.arange(5) + 0.5) * (70 / 5) / 14 - 0.5
    expected = bilinear_at(native[0], rows.clamp(min=0), cols.clamp(min=0))
    torch.testing.assert_close(first[0], expected, atol=1e-5, rtol=1e-5)


def bilinear_at(maps: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """(C, h, w) maps sampled bilinearly at the (row, col) cell coordinates of the grid rows x cols."""
    r0, c0 = rows.floor().long(), cols.floor().long()
    r1, c1 = (r0 + 1).clamp(max=maps.shape[1] - 1), (c0 + 1).clamp(max=maps.shape[2] - 1)
    fr, fc = (rows - r0)[:, None], (cols - c0)[None, :]
    top = maps[:, r0][:, :, c0] * (1 - fc) + maps[:, r0][:, :, c1] * fc
    bottom = maps[:, r1][:, :, c0] * (1 - fc) + maps[:, r1][:, :, c1] * fc
    return top * (1 - fr) + bottom * fr


def test_a_fixed_grid_model_reads_images_padded_to_its_size_and_refuses_larger_ones():
    """BEiT's relative positions are tied to its grid: a 48 x 80 image is read padded to the 112 x 112 it was built
    for, and the maps are the image's part of timm's; a larger image is a one-line error."""
    backbone, own = backbone_and_timm_model('beit_base_patch16_224')
    images = torch.randn(1, 3, 48, 80)
    with torch.no_grad():
        (first, _) = backbone(images)
        (native, _) = own.forward_intermediates(F.pad(images, (0, 32, 0, 64)), [1, 2], intermediates_only=True)
    torch.testing.assert_close(first, native[..., :3, :5], atol=1e-5, rtol=1e-5)
    with pytest.raises(UsageError, match='reads images of up to 112x112 pixels'):
        backbone(torch.randn(1, 3, 128, 64))


def test_a_pretrained_table_of_another_grid_is_resampled_as_timm_does(tmp_path):
    """DINOv2's weights come at 518 px (37 x 37 positions, no class slot with registers); a backbone built at 112
    loads them with the table resampled bicubically to its 8 x 8 grid, every other weight as it is."""
    torch.manual_seed(1)
    released = timm.create_model(DINOV2, img_size=518, num_classes=0, **TINY)
    path = tmp_path / 'dinov2.pth'
    torch.save(released.state_dict(), path)
    backbone = TokenBackbone(DINOV2, out_indices=(2,), img_size=112, model_kwargs=TINY, pretrained=str(path))
    backbone.init_weights()
    table = backbone.model.pos_embed
    assert table.shape == (1, 64, 32)
    expected = resample_abs_pos_embed(released.pos_embed, [8, 8], [37, 37], num_prefix_tokens=0)
    torch.testing.assert_close(table.data, expected)
    torch.testing.assert_close(backbone.model.reg_token.data, released.reg_token.data)
    torch.testing.assert_close(backbone.model.blocks[1].attn.qkv.weight.data, released.blocks[1].attn.qkv.weight.data)


@pytest.mark.parametrize('name, said', [
    ('convnext_tiny', "not 'convnext_tiny', or a plain timm ViT, which convnext_tiny is not (its builder says: "
                      'ConvNeXt'),
    ('swin_tiny_patch4_window7_224', 'which swin_tiny_patch4_window7_224 is not (SwinTransformer has no blocks, '
                                     'num_prefix_tokens)'),
])
def test_models_that_are_not_plain_vits_are_refused_naming_what_they_lack(name, said):
    with pytest.raises(UsageError, match=re.escape(said)):
        TokenBackbone(name, out_indices=(0,), img_size=64)


def test_the_training_tool_refuses_a_hierarchical_model_in_one_line(tmp_path):
    result = run_tool('train_seg.py', ['seg_configs/upernet_dinov2_s.py', '--work-dir', tmp_path / 'run',
                                        '--cfg-options', 'model.backbone.model_name=swin_tiny_patch4_window7_224'])
    said = one_line_error(result)  # (the config's DINOv2 model_kwargs are not Swin's either: either refusal is right)
    assert said.startswith("error: TokenBackbone takes a model of the suite, not 'swin_tiny_patch4_window7_224', or a "
                           'plain timm ViT, which swin_tiny_patch4_window7_224 is not')


def test_a_14_px_model_runs_windows_over_its_own_token_grid():
    """DINOv2 with windows of 3 tokens: the windows are laid on its 14 px grid (a 100 x 70 image: 8 x 5 tokens), and a
    window covering that whole grid gives the plain backbone's maps (LayerScale from 1, so that attention counts)."""
    kwargs = {**TINY, 'init_values': 1.0}

    def backbone(**windows) -> TokenBackbone:
        torch.manual_seed(0)
        return TokenBackbone(DINOV2, out_indices=(1, 2), img_size=112, model_kwargs=kwargs, **windows).eval()

    plain, whole, small = backbone(), backbone(window_size=8, global_blocks=()), backbone(window_size=3,
                                                                                          global_blocks=())
    images = torch.randn(1, 3, 100, 70)
    with torch.no_grad():
        expected, windowed, covered = plain(images), small(images), whole(images)
    torch.testing.assert_close(covered, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(windowed[1], expected[1], atol=1e-3)


def test_dynamic_size_is_refused_for_a_backbone_whose_trace_holds_at_its_size_only(tmp_path):
    """export --dynamic-size: a 14 px model (its grid resampled onto the stride-16 maps at the traced size's ratio),
    a fixed-grid model (BEiT) and window attention are refused in one line naming why; a 16 px model is not. Why:
    torch.export's program of the 14 px backbone traced at 64 x 96 fails at 96 x 48 (the export's check found it only
    after all the work)."""
    from backbones.common.errors import CheckpointError
    from backbones.common.exporting import write_exported_program
    from backbones.dense.export import check_dynamic_size

    def built(name: str, **options) -> TokenBackbone:
        return TokenBackbone(name, out_indices=(1, 2), img_size=64, model_kwargs=TINY, **options).eval()

    dinov2 = built(DINOV2)
    for backbone, why in ((dinov2, f"{DINOV2}'s 14 px tokens are resampled onto the stride-16 maps"),
                          (built('beit_base_patch16_224'),
                           'beit_base_patch16_224 reads one input size, its img_size 64'),
                          (built('deit3_small_patch16_224', window_size=2, global_blocks=(2,)),
                           'its attention windows are laid out for the traced size')):
        with pytest.raises(UsageError) as error:
            check_dynamic_size(backbone)
        assert str(error.value).startswith(f'--dynamic-size: {why}') and '\n' not in str(error.value)
    check_dynamic_size(built('deit3_small_patch16_224'))
    examples = [torch.randn(2, 3, 64, 96), torch.randn(1, 3, 96, 48)]
    with pytest.raises(CheckpointError, match='cannot run at input \\(1, 3, 96, 48\\)'):
        write_exported_program(dinov2, examples, tmp_path / 'dinov2.pt2', {0: ('batch', 1), 2: ('height', 16),
                                                                           3: ('width', 16)})
