"""Window attention and decomposed relative positions (backbones/window_attention.py, TokenBackbone's options):
global attention recovered exactly, windows checked against attention restricted to each window, padding without
effect, relative-position tables across sizes, training, refusals and the checkpoints' keys."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from mmseg.registry import MODELS
from timm.layers import Attention
from timm.models.beit import Attention as BeitAttention
from timm.models.eva import EvaAttention
from timm.models.vision_transformer_sam import get_rel_pos

import backbones.window_attention as window_attention
from backbones import create_model
from backbones.common.errors import UsageError
from backbones.window_attention import (
    WindowAttention,
    set_token_grid,
    use_window_attention,
    vitdet_global_blocks,
)
from helpers.commands import one_line_error, run_tool
from helpers.seg_data import DIM, TINY_MODELS

# A tiny model of each family whose blocks window attention takes, and the prefix tokens its blocks see.
FAMILIES = {
    'lvvit': ('lvvit_s', TINY_MODELS['upernet_lvvit_s.py'], 1),
    't2t_vit': ('t2t_vit_14', TINY_MODELS['upernet_t2t_vit_14.py'], 1),
    'cait': ('cait_s24_224', TINY_MODELS['upernet_cait_s24.py'], 0),
    'deit': ('deit_small_patch16_224', TINY_MODELS['upernet_deit_s.py'], 1),
}


def tiny_model(family: str, **kwargs) -> torch.nn.Module:
    if family == 'vit_registers':  # timm's VisionTransformer itself, with a class and 2 register tokens
        return timm.create_model('vit_small_patch16_224', img_size=64, num_classes=0, embed_dim=DIM, depth=4,
                                 num_heads=2, reg_tokens=2, dynamic_img_size=True, **kwargs).eval()
    name, model_kwargs, _ = FAMILIES[family]
    return create_model(name, img_size=64, num_classes=0, **{**model_kwargs, **kwargs}).eval()


def prefix_tokens(family: str) -> int:
    return 3 if family == 'vit_registers' else FAMILIES[family][2]


def randomised(attn: torch.nn.Module) -> torch.nn.Module:
    """The attention with random weights of a trained model's scale (CaiT's talking-heads mixes start near the
    identity; LayerScale would hide the blocks' effect in a whole model)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return attn


def windowed(attn: torch.nn.Module, window: int | None, prefix: int, grid: tuple[int, int],
             rel_pos_side: int | None = None) -> WindowAttention:
    module = WindowAttention(attn, window, rel_pos_side, prefix).eval()
    module.grid = grid
    return module


ALL_FAMILIES = [*FAMILIES, 'vit_registers']


@pytest.mark.parametrize('family', ALL_FAMILIES)
def test_a_window_covering_the_grid_is_global_attention(family):
    """Without relative positions, one window over the whole grid (padded: 4x6 in a 6x6 window) is the block's own
    global attention, prefix tokens included."""
    prefix = prefix_tokens(family)
    attn = randomised(tiny_model(family).blocks[1].attn)
    x = torch.randn(2, prefix + 4 * 6, DIM)
    with torch.no_grad():
        expected = attn(x)
        for window in (6, None):  # one padded window; no windows at all
            torch.testing.assert_close(windowed(attn, window, prefix, (4, 6))(x), expected, atol=1e-5, rtol=0)


def test_a_window_covering_the_grid_is_global_attention_in_the_whole_model():
    model = tiny_model('lvvit')
    images = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        expected = model.forward_intermediates(images, [3], intermediates_only=True)[0]
        use_window_attention(model, 6, global_blocks=())
        set_token_grid(model, (4, 6))
        got = model.forward_intermediates(images, [3], intermediates_only=True)[0]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def window_tokens(grid: tuple[int, int], window: int) -> list[list[int]]:
    """The patch-token indices (row-major over the grid) of each window, the grid's padding left out."""
    H, W = grid
    return [[r * W + c for r in range(top, min(top + window, H)) for c in range(left, min(left + window, W))]
            for top in range(0, H, window) for left in range(0, W, window)]


@pytest.mark.parametrize('family', ['lvvit', 'cait', 'vit_registers'])
def test_windows_are_attention_restricted_to_each_window_and_the_prefix_tokens(family):
    """An independent reference: the original attention run on each window's real tokens with the prefix tokens
    gives that window's outputs; its run on all tokens gives the prefix tokens' (a 5x7 grid in 3x3 windows: padded
    on both axes, so masking the padded keys matters, for CaiT's talking heads too)."""
    prefix, grid, window = prefix_tokens(family), (5, 7), 3
    attn = randomised(tiny_model(family).blocks[0].attn)
    x = torch.randn(2, prefix + 35, DIM)
    with torch.no_grad():
        got = windowed(attn, window, prefix, grid)(x)
        expected = torch.empty_like(got)
        expected[:, :prefix] = attn(x)[:, :prefix]
        for tokens in window_tokens(grid, window):
            index = list(range(prefix)) + [prefix + t for t in tokens]
            expected[:, index[prefix:]] = attn(x[:, index])[:, prefix:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize('family', ['lvvit', 'cait'])
def test_what_the_padding_holds_does_not_change_the_outputs(family, monkeypatch):
    """Windows over a 5x7 grid padded with noise instead of zeros, relative positions on: the same outputs."""
    prefix = prefix_tokens(family)
    module = windowed(randomised(tiny_model(family).blocks[0].attn), 3, prefix, (5, 7), rel_pos_side=3)
    with torch.no_grad():
        module.rel_pos_h.normal_()
        module.rel_pos_w.normal_()
    x = torch.randn(2, prefix + 35, DIM)
    with torch.no_grad():
        expected = module(x)
        partition = window_attention.window_partition

        def noisy_partition(t: torch.Tensor, size: int):
            windows, padded = partition(t, size)
            inside = partition(torch.ones_like(t), size)[0].bool()
            return torch.where(inside, windows, torch.randn_like(windows) * 10), padded

        monkeypatch.setattr(window_attention, 'window_partition', noisy_partition)
        got = module(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def materialised_attention(module: WindowAttention, x: torch.Tensor) -> torch.Tensor:
    """An independent reference for attention with relative positions: each window's real tokens attend to the
    prefix tokens and to each other with the full (queries x keys) bias, each pair's term looked up by its row and
    column offsets (`q . Rh[r_q, r_k] + q . Rw[c_q, c_k]`); the prefix tokens attend to every token without bias.
    A grid without windows is one window. CaiT's talking heads mix the biased logits and the weights across heads."""
    prefix, (H, W) = module.num_prefix_tokens, module.grid
    size = module.window_size or max(H, W)
    tables = [get_rel_pos(side, side, table) for side, table in zip((module.window_size or H, module.window_size or W),
                                                                    (module.rel_pos_h, module.rel_pos_w))]
    B, N, _ = x.shape
    q, k, v = module.qkv(x).reshape(B, N, 3, module.num_heads, module.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def attend(queries: list[int], keys: list[int], bias: torch.Tensor | float) -> torch.Tensor:
        logits = q[:, :, queries] @ k[:, :, keys].transpose(-2, -1) * module.scale + bias
        if not module.talking_heads:
            return logits.softmax(-1) @ v[:, :, keys]
        logits = module.proj_l(logits.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return module.proj_w(logits.softmax(-1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2) @ v[:, :, keys]

    out = torch.empty_like(q)
    out[:, :, :prefix] = attend(list(range(prefix)), list(range(N)), 0.0)
    for tokens in window_tokens((H, W), size):
        rows, columns = (torch.tensor([t // W % size for t in tokens]), torch.tensor([t % W % size for t in tokens]))
        index = [prefix + t for t in tokens]
        pairs = (tables[0][rows][:, rows], tables[1][columns][:, columns])  # (queries, keys, C) each
        bias = sum(torch.einsum('bhqc,qkc->bhqk', q[:, :, index], table) for table in pairs)
        out[:, :, index] = attend(index, list(range(prefix)) + index, F.pad(bias, (prefix, 0)))
    return module.proj(out.transpose(1, 2).reshape(B, N, -1))


@pytest.mark.parametrize('dtype, tolerance', [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize('window, grid', [(3, (5, 7)), (3, (6, 6)), (None, (5, 7))])
@pytest.mark.parametrize('family', ['vit_registers', 'cait'])
def test_relative_positions_inside_the_dot_products_match_the_materialised_bias_forward_and_backward(
        window, grid, family, dtype, tolerance):
    """The bias taken inside fused attention's dot products (each query's row and column terms against each key's
    one-hot row and column) gives the outputs and the gradients (input, qkv and proj weights, both tables) of
    attention with the whole bias materialised, in windows padded or not and without windows, with class and
    register tokens; CaiT's talking heads with the bias added to their logits likewise."""
    torch.manual_seed(0)
    attn = randomised(tiny_model(family).blocks[0].attn)
    module = windowed(attn, window, prefix_tokens(family), grid, rel_pos_side=window or max(grid)).to(dtype).train()
    with torch.no_grad():
        module.rel_pos_h.normal_()
        module.rel_pos_w.normal_()
    x = torch.randn(2, prefix_tokens(family) + grid[0] * grid[1], DIM, dtype=dtype, requires_grad=True)
    weights = torch.randn(x.shape, dtype=dtype)
    inputs = [x, module.qkv.weight, module.proj.weight, module.rel_pos_h, module.rel_pos_w]
    inputs += [p for name, p in module.named_parameters() if name in ('qkv.bias', 'proj_l.weight', 'proj_w.weight')]
    got, expected = module(x), materialised_attention(module, x)
    assert_close_to_scale(got, expected, tolerance)
    for g, e in zip(torch.autograd.grad((got * weights).sum(), inputs),
                    torch.autograd.grad((expected * weights).sum(), inputs)):
        assert_close_to_scale(g, e, tolerance)


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    """Equal to `tolerance` times the largest magnitude of `expected` (the gradients here reach 100, where float32's
    sums in another order differ by 1e-5)."""
    scale = expected.abs().max()
    assert scale > 0
    torch.testing.assert_close(got, expected, atol=tolerance * scale.item(), rtol=0)


def backbone(**options) -> torch.nn.Module:
    return MODELS.build(dict(type='TokenBackbone', model_name='lvvit_s', out_indices=(3,), img_size=64,
                             model_kwargs=TINY_MODELS['upernet_lvvit_s.py']) | options)


def test_windows_change_the_output_and_train_with_grads_reaching_the_tables():
    """2-token windows (block 3 global) with relative positions: another output than global attention from the same
    weights; a training step's gradients are finite, reach every table, and are the same with gradient
    checkpointing (which recomputes the blocks in the backward pass, with the grid of their forward)."""
    torch.manual_seed(0)
    plain = backbone().eval()
    windows = backbone(window_size=2, global_blocks=(3,), rel_pos=True).eval()
    assert windows.load_state_dict(plain.state_dict(), strict=False).missing_keys == [
        f'model.blocks.{i}.attn.rel_pos_{axis}' for i in range(4) for axis in 'hw']
    images = torch.randn(2, 3, 40, 72)  # padded to 48x80: a 3x5 grid
    with torch.no_grad():
        assert (windows(images)[0] - plain(images)[0]).abs().max() > 1e-3
    checkpointed = copy.deepcopy(windows)
    checkpointed.model.set_grad_checkpointing(True)
    grads = []
    for model in (windows.train(), checkpointed.train()):
        with torch.no_grad():  # tables away from zero, so that their gradients are not the only thing tested
            for name, p in model.named_parameters():
                if 'rel_pos' in name:
                    p.copy_(torch.linspace(-1, 1, p.numel()).reshape(p.shape))
        model(images)[0].square().mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    tables = [n for n in grads[0] if 'rel_pos' in n]
    assert len(tables) == 8
    for name in tables:
        assert torch.isfinite(grads[0][name]).all() and grads[0][name].abs().sum() > 0, name
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)
    optimizer = torch.optim.SGD(windows.parameters(), lr=0.1)
    before = windows.model.blocks[0].attn.rel_pos_h.detach().clone()
    optimizer.step()
    assert not torch.equal(windows.model.blocks[0].attn.rel_pos_h, before)


def test_relative_position_tables_survive_another_input_size():
    """The global block's tables are sized for the 4x4 grid of img_size 64 (7 rows), the windows' for 2 tokens (3
    rows); a 6x9 grid runs them interpolated; a checkpoint whose tables have other lengths loads them resampled as
    timm's get_rel_pos interpolates them."""
    model = backbone(window_size=2, global_blocks=(3,), rel_pos=True).eval()
    assert model.model.blocks[0].attn.rel_pos_h.shape == (5 - 2, DIM // 2)
    assert model.model.blocks[3].attn.rel_pos_w.shape == (7, DIM // 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'rel_pos' in name:
                p.normal_()
        maps = model(torch.randn(1, 3, 96, 144))[0]
    assert maps.shape == (1, DIM, 6, 9) and torch.isfinite(maps).all()

    state = model.state_dict()
    other = {k: torch.randn(2 * v.shape[0] + 3, v.shape[1]) if 'rel_pos' in k else v for k, v in state.items()}
    model.load_state_dict(other)
    for key, table in other.items():
        if 'rel_pos' in key:
            side = (state[key].shape[0] + 1) // 2
            torch.testing.assert_close(get_rel_pos(side, side, model.state_dict()[key]),
                                       get_rel_pos(side, side, table))


def test_a_checkpoint_of_another_grid_loads_its_tables_resampled_through_the_tools_loader(tmp_path):
    """load_weights (test_seg's, predict_seg's, export's): a windowed backbone's checkpoint whose global block's
    tables are sized for img_size 64 (7 rows) loads into one of img_size 128 (15 rows), resampled as timm's
    get_rel_pos; before, it was refused as mis-shaped."""
    from backbones.dense.runner import load_weights
    trained = backbone(window_size=2, global_blocks=(3,), rel_pos=True)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if 'rel_pos' in name:
                p.normal_()
    torch.save({'state_dict': trained.state_dict()}, tmp_path / 'trained.pth')
    larger = backbone(window_size=2, global_blocks=(3,), rel_pos=True, img_size=128)
    load_weights(larger, str(tmp_path / 'trained.pth'))
    table = trained.model.blocks[3].attn.rel_pos_h
    assert larger.model.blocks[3].attn.rel_pos_h.shape == (15, DIM // 2)
    torch.testing.assert_close(get_rel_pos(8, 8, larger.model.blocks[3].attn.rel_pos_h), get_rel_pos(8, 8, table))
    torch.testing.assert_close(larger.model.blocks[0].attn.rel_pos_w, trained.model.blocks[0].attn.rel_pos_w)


def test_a_classifiers_checkpoint_loads_strictly_apart_from_the_tables(tmp_path):
    """The pretrained keys stay the classifier's: its checkpoint loads through the backbone's Pretrained init
    (strict: a missing key is an error), every weight equal, the relative-position tables left at zero."""
    classifier = create_model('lvvit_s', img_size=64, num_classes=10, **TINY_MODELS['upernet_lvvit_s.py'])
    path = tmp_path / 'classifier.pth'
    torch.save({'state_dict': classifier.state_dict()}, path)
    model = backbone(window_size=2, rel_pos=True, pretrained=str(path))
    model.init_weights()
    own = model.model.state_dict()
    expected = classifier.state_dict()
    assert sorted(k for k in own if k not in expected) == [
        f'blocks.{i}.attn.rel_pos_{axis}' for i in range(4) for axis in 'hw']
    for key, value in own.items():
        if 'rel_pos' in key:
            assert not value.any()
        else:
            torch.testing.assert_close(value, expected[key], atol=0, rtol=0)


def test_vitdets_global_blocks():
    assert vitdet_global_blocks(12) == (2, 5, 8, 11)
    assert vitdet_global_blocks(16) == (3, 7, 11, 15)
    assert vitdet_global_blocks(24) == (5, 11, 17, 23)
    assert vitdet_global_blocks(32) == (7, 15, 23, 31)
    assert vitdet_global_blocks(2) == (0, 1)
    model = tiny_model('lvvit', depth=8)
    use_window_attention(model, 2)  # global blocks 1, 3, 5, 7 keep their own attention
    assert [isinstance(b.attn, WindowAttention) for b in model.blocks] == [True, False] * 4


@pytest.mark.parametrize('options, words', [
    (dict(window_size=0), 'window_size must be a whole number of tokens, 1 or more, got 0'),
    (dict(window_size=2.5), 'got 2.5'),
    (dict(window_size=2, global_blocks=(1, 4)), 'global_blocks (1, 4): [4] name no block of the model (0..3)'),
    (dict(window_size=2, global_blocks=(-1,)), '[-1] name no block'),
    (dict(global_blocks=(1,)), 'global_blocks (1,) need a window_size'),
    (dict(window_size=2, global_blocks=2), 'global_blocks must be a list of block indices (e.g. (2, 5, 8, 11)), got 2'),
    (dict(global_blocks=3), 'global_blocks must be a list of block indices'),
    (dict(window_size=2, rel_pos='no'), "rel_pos must be True or False, got 'no'"),
])
def test_bad_window_options_are_refused_in_one_line(options, words):
    with pytest.raises(UsageError) as error:
        backbone(**options)
    assert words in str(error.value) and '\n' not in str(error.value)


@pytest.mark.parametrize('attention, words', [
    (lambda: EvaAttention(DIM, num_heads=2, norm_layer=torch.nn.LayerNorm),
     'EvaAttention cannot be windowed: its rotary position embeddings'),
    (lambda: BeitAttention(DIM, num_heads=2, window_size=(4, 4)),
     'timm.models.beit.Attention cannot be windowed: it adds its own relative position bias'),
    (lambda: type('OwnAttention', (Attention,), {})(DIM, num_heads=2),  # a class no family's record names
     "OwnAttention cannot be windowed: window attention reproduces the forward of the families' attention only: "
     'TalkingHeadAttn, Attention'),
])
def test_attention_window_attention_cannot_take_over_is_refused_by_name(attention, words):
    model = tiny_model('lvvit')
    model.blocks[2].attn = attention()
    with pytest.raises(UsageError) as error:
        use_window_attention(model, 2)
    assert 'block 2\'s attention' in str(error.value) and words in str(error.value)
    assert '\n' not in str(error.value)
    assert not any(isinstance(m, WindowAttention) for m in model.modules())  # refused before any block changed


def test_a_forward_without_the_grid_is_refused():
    model = tiny_model('lvvit')
    use_window_attention(model, 2, global_blocks=())
    with pytest.raises(UsageError, match='hand the grid over with set_token_grid'):
        model.forward_intermediates(torch.randn(1, 3, 64, 64), [3], intermediates_only=True)
    set_token_grid(model, (4, 6))  # another grid than the tokens'
    with pytest.raises(UsageError, match='17 tokens are not 1 prefix tokens and the token grid \\(4, 6\\)'):
        model.forward_intermediates(torch.randn(1, 3, 64, 64), [3], intermediates_only=True)


def test_the_windowed_backbone_exports_at_a_fixed_size():
    """torch.export of the backbone with windows and relative positions at a fixed size, equal to the model."""
    model = backbone(window_size=2, global_blocks=(3,), rel_pos=True).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'rel_pos' in name:
                p.normal_()
    images = torch.randn(1, 3, 40, 72)
    program = torch.export.export(model, (images,))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(images)[0], model(images)[0], atol=1e-5, rtol=0)


def test_the_windowed_backbone_exports_to_onnx_with_a_dynamic_batch(tmp_path):
    """torch's ONNX exporter on the backbone with windows (a grid they pad) and relative positions, the batch
    dynamic, checked in onnxruntime against the model at batches 2, 1 and 3 (the exporter replayed a view of
    SDPA's transposed output on other strides and failed)."""
    from backbones.common.exporting import BATCH, CHECKED_BATCHES, write_onnx

    model = backbone(window_size=2, global_blocks=(3,), rel_pos=True).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if 'rel_pos' in name:
                p.normal_()
    examples = [torch.randn(batch, 3, 40, 72) for batch in CHECKED_BATCHES]
    write_onnx(model, examples, tmp_path / 'backbone.onnx', BATCH, ['maps'])  # a CheckpointError where they differ
    assert (tmp_path / 'backbone.onnx').is_file()


def test_the_training_tool_refuses_a_bad_window_option_before_any_work(tmp_path):
    """train_seg's check of the backbone builds it whole (on the meta device): a window option it refuses stops the
    run in one line before the runner starts (no work dir, no log) and before the embedded pages' pretraining."""
    result = run_tool('train_seg.py', ['seg_configs/maskrcnn_lvvit_s_windowed.py', '--work-dir', tmp_path / 'run',
                                        '--cfg-options', 'model.backbone.window_size=0'])
    assert one_line_error(result) == ('error: window_size must be a whole number of tokens, 1 or more, got 0  '
                                      '(--debug shows the traceback)')
    assert not (tmp_path / 'run').exists()


def test_the_windowed_detector_config_trains_and_predicts_and_the_pages_get_small_windows(tmp_path):
    """maskrcnn_lvvit_s_windowed.py, tiny (2-token windows, block 3 global): a training step with finite losses
    whose gradients reach the tables, then a prediction; on the embedded pages the task's small-model settings give
    the windowed config 3-token windows and leave the plain config without windows."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmengine.structures import InstanceData
    from mmseg.structures import SegDataSample

    from backbones.dense.instances.task import SMALL_DATA_WINDOW
    from backbones.dense.tasks import task_of
    from helpers.dense_data import CONFIGS, write_tiny_coco, write_tiny_dense_config

    for name, window in (('maskrcnn_lvvit_s_windowed.py', SMALL_DATA_WINDOW), ('maskrcnn_lvvit_s.py', None)):
        cfg = Config.fromfile(CONFIGS / name)
        task_of(cfg).use_small_model(cfg)
        assert cfg.model.backbone.get('window_size') == window
    init_default_scope('mmseg')
    path = write_tiny_dense_config(tmp_path / 'tiny.py', 'maskrcnn_lvvit_s_windowed.py', write_tiny_coco(tmp_path))
    cfg = Config.fromfile(path)
    cfg.model.backbone.update(window_size=2, global_blocks=(3,))
    cfg.model.num_classes = 3
    model = MODELS.build(cfg.model).train()
    sample = SegDataSample(metainfo=dict(img_shape=(48, 64), ori_shape=(48, 64), pad_shape=(64, 64)))
    sample.gt_instances = InstanceData(bboxes=torch.tensor([[4.0, 4.0, 30.0, 40.0]]), labels=torch.tensor([1]),
                                       masks=torch.ones(1, 48, 64, dtype=torch.uint8))
    data = dict(inputs=[torch.randint(0, 255, (3, 48, 64), dtype=torch.uint8)], data_samples=[sample])
    optim = build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.01)))
    losses = model.train_step(data, optim)
    assert all(torch.isfinite(v) for v in losses.values())
    assert model.backbone.model.blocks[0].attn.rel_pos_h.abs().sum() > 0  # zero at first, moved by the step
    predictions = model.eval().val_step(data)
    assert len(predictions) == 1


def test_the_window_comparison_takes_its_ratios_from_the_two_steps(monkeypatch):
    """compare_window_attention's ratios, windows / global: the time of a step (the inverse of the rates), and the
    peak memory (the device's on a GPU; on a CPU the process's above its memory before the first step)."""
    from classification.studies.dense import training_step as study

    def step(config: str, device: torch.device, *args) -> study.DenseStep:
        windows = config.endswith('_windowed.py')  # the same figures with relative positions and without
        return study.DenseStep(config, 'instances', 1, (512, 512), 2.0 if windows else 1.0, 2.0 if windows else 1.0,
                               (3.0 if windows else 6.0) if device.type == 'cuda' else None,
                               *((2.5 if windows else 4.0, 1.0) if device.type == 'cpu' else (None, None)))

    monkeypatch.setattr(study, 'step_in_fresh_process', step)
    on_cpu = study.compare_window_attention(torch.device('cpu'), 1.0, 1, 1)
    variants = ['windows', 'windows_without_rel_pos']
    assert on_cpu['ratios'] == {name: {'time': 0.5, 'memory': 0.5} for name in variants}  # (2.5 - 1) / (4 - 1)
    assert on_cpu['windows']['config'] == 'seg_configs/maskrcnn_lvvit_s_windowed.py'
    on_gpu = study.compare_window_attention(torch.device('cuda'), 1.0, 1, 1)
    assert on_gpu['ratios'] == {name: {'time': 0.5, 'memory': 0.5} for name in variants}  # 3 / 6
