"""The model contract shared by the four families, and the published sizes."""
from __future__ import annotations

import fnmatch
import re

import pytest
import timm
import torch
from timm.layers import set_fused_attn
from timm.models import get_pretrained_cfg
from timm.optim import param_groups_layer_decay
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import backbones
from backbones import load_checkpoint
from backbones.complexity import measure_complexity
from backbones.token_head import mix_box_lambda, mix_token_grid, patch_embedding, sample_mix_box, token_grid
from helpers.commands import ROOT
from helpers.models import save_release
from helpers.reference_models import ref_sinusoid

# Published parameter counts (millions), REFERENCE §1.
PUBLISHED_PARAMS = {
    'lvvit_t': 8.5, 'lvvit_s': 26.2, 'lvvit_m': 55.8, 'lvvit_l': 150.5,
    't2t_vit_7': 4.3, 't2t_vit_10': 5.9, 't2t_vit_12': 6.9, 't2t_vit_14': 21.5, 't2t_vit_19': 39.2,
    't2t_vit_24': 64.1,
    'cait_xxs24_224': 12.0, 'cait_xxs36_224': 17.3, 'cait_xs24_224': 26.6, 'cait_xs36_224': 38.6,
    'cait_s24_224': 46.9, 'cait_s36_224': 68.2, 'cait_s48_224': 89.5, 'cait_m24_224': 185.9, 'cait_m36_224': 270.9,
    'vit_base_patch16_224': 86.6, 'vit_large_patch16_224': 304.3, 'deit_small_patch16_224': 22.1,
    'vit_small_patch16_legacy_224': 48.6,
}
# Published MACs (G) at 224.
PUBLISHED_MACS = {'lvvit_s': 6.6, 't2t_vit_14': 4.8, 't2t_vit_t_14': 6.1, 'cait_s24_224': 9.4}

# One small but architecturally complete member of each family (fewer blocks keep the tests fast).
SMALL = {
    'lvvit': ('lvvit_t', dict(depth=3)),
    't2t_vit': ('t2t_vit_7', dict(depth=3)),
    't2t_vit_t': ('t2t_vit_t_14', dict(depth=3)),
    'cait': ('cait_xxs24_224', dict(depth=3)),
    'vit': ('deit_small_patch16_224', dict(depth=3)),
}


@pytest.mark.parametrize('name', list(PUBLISHED_PARAMS))
def test_parameter_count_matches_paper(name):
    params = measure_complexity(name).params / 1e6
    # Within 0.5%, or within the rounding of a figure printed with one decimal (T2T-ViT-12: 6.94M printed 6.9M).
    assert abs(params - PUBLISHED_PARAMS[name]) <= max(0.005 * PUBLISHED_PARAMS[name], 0.05)


@pytest.mark.parametrize('name', list(PUBLISHED_MACS))
def test_macs_match_paper(name):
    macs = measure_complexity(name, img_size=224).macs
    assert abs(macs / 1e9 - PUBLISHED_MACS[name]) <= 0.05 * PUBLISHED_MACS[name]


def test_every_family_is_registered_in_timm():
    assert {family.name for family in backbones.families()} == {'vit', 't2t_vit', 'cait', 'lvvit'}
    for name in backbones.suite_models():
        assert timm.is_model(name)
        assert name in timm.list_models()


def test_wrong_model_name_suggests_close_names():
    with pytest.raises(ValueError, match='lvvit_s') as info:
        backbones.create_model('lvvit_ss')
    assert 'did you mean' in str(info.value)


@pytest.mark.parametrize('family', list(SMALL))
def test_forward_intermediates_non_square(family):
    name, kwargs = SMALL[family]
    model = backbones.create_model(name, num_classes=5, **kwargs).eval()
    x = torch.randn(2, 3, 224, 320)
    with torch.no_grad():
        maps = model.forward_intermediates(x, [0, 2], intermediates_only=True)
        final, last = model.forward_intermediates(x, 1)
        logits = model(x)
    assert [m.shape for m in maps] == [(2, model.embed_dim, 14, 20)] * 2
    assert last[0].shape == (2, model.embed_dim, 14, 20)
    assert torch.allclose(final, model.forward_features(x), atol=1e-5)
    assert logits.shape == (2, 5)
    # NLC layout is the same tokens, row-major.
    with torch.no_grad():
        (tokens,) = model.forward_intermediates(x, [2], output_fmt='NLC', intermediates_only=True)
    assert torch.equal(tokens, maps[1].flatten(2).transpose(1, 2))


@pytest.mark.parametrize('family', list(SMALL))
def test_intermediate_maps_keep_image_layout(family):
    """Changing one 16x16 patch of a non-square image changes the map most at that patch's (row, col)."""
    name, kwargs = SMALL[family]
    model = backbones.create_model(name, **kwargs).eval()
    x = torch.randn(1, 3, 64, 112)
    y = x.clone()
    row, col = 1, 5
    y[:, :, 16 * row:16 * row + 16, 16 * col:16 * col + 16] += 5.0
    with torch.no_grad():
        a, b = (model.forward_intermediates(t, [0], intermediates_only=True)[0] for t in (x, y))
    change = (a - b).abs().sum(1)[0]  # (H, W)
    assert change.shape == (4, 7)
    assert divmod(change.argmax().item(), 7) == (row, col)


@pytest.mark.parametrize('family', list(SMALL))
def test_other_input_size_equals_model_built_for_it(family, tmp_path):
    """Runtime position-embedding resampling agrees with the loader's resampling into a model of that size."""
    name, kwargs = SMALL[family]
    small = backbones.create_model(name, img_size=64, num_classes=3, **kwargs).eval()
    path = save_release(tmp_path / 'small.pth', small.state_dict(), 'plain')
    large = backbones.create_model(name, img_size=96, num_classes=3, **kwargs).eval()
    report = load_checkpoint(large, path)
    assert report.resized == ['pos_embed']
    x = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        assert torch.allclose(small(x), large(x), atol=1e-5)


def test_fused_attention_matches_explicit_softmax():
    """SDPA paths (timm's Attention in our blocks, T2T's one-head layer) equal the explicit computation."""
    x = torch.randn(2, 3, 96, 96)
    outputs = []
    for fused in (True, False):
        set_fused_attn(fused)
        try:
            torch.manual_seed(0)
            models = [backbones.create_model(n, img_size=96, depth=2).eval() for n in ('lvvit_t', 't2t_vit_t_14')]
        finally:
            set_fused_attn(True)
        assert all(m.blocks[0].attn.fused_attn == fused for m in models)
        assert models[1].tokens_to_token.attention1.attn.fused_attn == fused
        with torch.no_grad():
            outputs.append([m(x) for m in models])
    for fused_out, explicit_out in zip(*outputs):
        assert torch.allclose(fused_out, explicit_out, atol=1e-4)


def test_t2t_frozen_tables():
    model = backbones.create_model('t2t_vit_14')
    assert torch.allclose(model.pos_embed, ref_sinusoid(197, 384), atol=1e-6)
    w = model.tokens_to_token.attention1.w
    assert w.shape == (32, 64) and not w.requires_grad and not model.pos_embed.requires_grad
    assert torch.allclose(w @ w.t(), 32 * torch.eye(32), atol=1e-3)  # orthogonal rows of norm sqrt(m)


def test_performer_stays_finite_and_accurate_under_low_precision_autocast():
    model = backbones.create_model('t2t_vit_7', img_size=64, depth=1).eval()
    x = 4 * torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        exact = model(x)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            low = model(x)
    assert torch.isfinite(low).all()
    assert (low.float() - exact).abs().max() <= 0.05 * exact.abs().max()


def test_drop_path_schedules():
    lvvit = backbones.create_model('lvvit_s', drop_path_rate=0.3)
    rates = [b.drop_path.drop_prob if hasattr(b.drop_path, 'drop_prob') else 0.0 for b in lvvit.blocks]
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.3) and rates == sorted(rates)
    cait = backbones.create_model('cait_xxs24_224', drop_path_rate=0.2)
    assert [b.drop_path.drop_prob for b in cait.blocks] == [pytest.approx(0.2)] * 24  # constant in CaiT


@pytest.mark.parametrize('name', ['lvvit_t', 't2t_vit_7', 't2t_vit_t_14'])
@pytest.mark.parametrize('size', [(48, 48), (70, 50), (33, 47), (96, 17)])
def test_token_grid_is_the_grid_the_patch_embedding_makes(name, size):
    """The suite's patch embeddings take any size: the grid computed from their layers' arithmetic is the grid
    their forward makes (odd sizes round differently in each layer)."""
    embedding = patch_embedding(backbones.create_model(name, img_size=64))
    with torch.no_grad():
        tokens = embedding(torch.zeros(1, 3, *size))
    assert token_grid(embedding, size) == tuple(tokens.shape[1:3])


def test_mix_token_box_and_grid_mixing():
    torch.manual_seed(1)
    grid = (14, 14)
    boxes = [sample_mix_box(grid) for _ in range(200)]
    for top, left, bottom, right in boxes:
        assert 0 <= top <= bottom <= 14 and 0 <= left <= right <= 14
    inside = [(bottom - top, right - left) for top, left, bottom, right in boxes
              if top > 0 and left > 0 and bottom < 14 and right < 14]
    assert inside and all(h == w for h, w in inside)  # one cut ratio for both sides on a square grid
    assert len(inside) < len(boxes)  # and boxes are clipped at the borders, hence lambda from the clipped box
    x = torch.arange(4.0).view(4, 1, 1, 1).expand(4, 3, 5, 2).clone()  # sample i holds value i
    mixed = mix_token_grid(x, (1, 2, 3, 5))
    assert torch.equal(mixed[:, 1:3, 2:5], x.flip(0)[:, 1:3, 2:5])
    outside = torch.ones(3, 5, dtype=torch.bool)
    outside[1:3, 2:5] = False
    assert torch.equal(mixed[:, outside], x[:, outside])
    assert mix_box_lambda((1, 2, 3, 5), (3, 5)) == pytest.approx(1 - 6 / 15)


def test_lvvit_eval_and_training_outputs():
    model = backbones.create_model('lvvit_t', img_size=64, depth=2, num_classes=6)
    x = torch.randn(3, 3, 64, 64)
    out = model.train().forward_train(x)
    assert isinstance(out, backbones.TokenLabelingOutput)
    assert out.cls_logits.shape == (3, 6) and out.token_logits.shape == (3, 4, 4, 6)
    plain = backbones.create_model('lvvit_t', img_size=64, depth=2, num_classes=6, mix_token=0).train()
    assert plain.forward_train(x).mix_box is None
    headless = backbones.create_model('lvvit_t', img_size=64, depth=2, num_classes=0).eval()
    assert headless(x).shape == (3, 240) and headless.aux_head is None


@pytest.mark.parametrize('family', list(SMALL))
def test_features_only_returns_the_blocks_forward_intermediates_gives(family):
    """timm's feature extraction contract: `features_only=True`, `feature_info`, the chosen blocks' maps."""
    name, kwargs = SMALL[family]
    features = backbones.create_model(name, features_only=True, out_indices=(0, 2), img_size=64, **kwargs).eval()
    model = backbones.create_model(name, img_size=64, **kwargs).eval()
    model.load_state_dict(features.model.state_dict(), strict=False)  # the pruned net lacks the norm and heads
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        maps, expected = features(x), model.forward_intermediates(x, indices=[0, 2], intermediates_only=True)
    assert features.feature_info.reduction() == [16, 16]
    assert features.feature_info.channels() == [model.embed_dim] * 2
    assert [m.shape for m in maps] == [(2, model.embed_dim, 4, 4)] * 2
    for got, want in zip(maps, expected):
        torch.testing.assert_close(got, want)


def counting(forward, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)
    return counted


@pytest.mark.parametrize('family', list(SMALL))
def test_grad_checkpointing_gives_the_same_gradients(family):
    """Checkpointed blocks (recomputed in the backward pass) change memory, not results: in the classifier's
    forward and in forward_intermediates (what the segmentation backbone runs)."""
    name, kwargs = SMALL[family]
    torch.manual_seed(0)
    plain = backbones.create_model(name, img_size=64, num_classes=5, **kwargs).train()
    checkpointed = backbones.create_model(name, img_size=64, num_classes=5, **kwargs).train()
    checkpointed.load_state_dict(plain.state_dict())
    checkpointed.set_grad_checkpointing(True)
    x = torch.randn(2, 3, 64, 64)
    for run in (lambda m: m.forward_features(x).square().mean(),
                lambda m: sum(f.square().mean() for f in m.forward_intermediates(x, indices=2,
                                                                                 intermediates_only=True))):
        grads, calls = [], []
        for model in (plain, checkpointed):
            model.zero_grad()
            counted, block = [], model.blocks[0]
            block.forward = counting(block.forward, counted)  # (a recomputation runs no forward hooks)
            torch.manual_seed(1)  # the same draws for any randomness in the forward (Performer's features)
            run(model).backward()
            del block.forward
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            calls.append(len(counted))
        assert calls == [1, 2]  # checkpointed: the block runs again in the backward pass
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for key in grads[0]:
            torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('family', list(SMALL))
def test_group_matcher_gives_timms_layer_decay_the_embedding_blocks_and_head(family):
    """timm's `param_groups_layer_decay` on the models, as on timm's own ViT: the embedding (the T2T module too) at
    rate ** (depth + 1), block i at rate ** (depth - i), the final norm with the last block, the heads at the full
    lr."""
    name, kwargs = SMALL[family]
    model = backbones.create_model(name, img_size=64, num_classes=5, **kwargs)
    depth, rate = len(model.blocks), 0.5
    scale_of = {id(p): group['lr_scale'] for group in param_groups_layer_decay(model, layer_decay=rate)
                for p in group['params']}
    for param_name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param_name.startswith(('patch_embed', 'tokens_to_token', 'cls_token', 'pos_embed')):
            expected = rate ** (depth + 1)
        elif param_name.startswith('blocks.'):
            expected = rate ** (depth - int(param_name.split('.')[1]))
        elif param_name.startswith('blocks_token_only.'):  # CaiT: timm overlaps them with the last blocks
            continue
        elif param_name.startswith('norm.'):
            expected = rate
        else:
            expected = 1.0
        assert scale_of[id(param)] == pytest.approx(expected), param_name


# timm's own model tests (pytorch-image-models tests/test_models.py) hold every model in its registry to a contract:
# cfgs that name the model's weights and widths, a plain-tensor training forward whose backward reaches every
# parameter, TorchScript and torch.fx. The tests below hold the suite's families to it (small models at 64 px), and
# compare the scripted and traced models with the eager one where timm only runs them.

def small_model(family: str, **kwargs) -> torch.nn.Module:
    name, defaults = SMALL[family]
    return backbones.create_model(name, img_size=64, **{**defaults, **kwargs})


def as_names(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@pytest.mark.parametrize('name', [*backbones.suite_models('lvvit'), *backbones.suite_models('t2t_vit'),
                                  'cait_xs24_224', 'vit_small_patch16_legacy_224'])
def test_every_pretrained_cfg_names_the_models_first_layer_and_classifiers(name):
    """timm's cfg test, for every tag: `first_conv` and `classifier` are weights of the model it builds, which has
    timm's widths."""
    for tag in timm.list_models(name, include_tags=True):
        with torch.device('meta'):  # (no memory, no initialisation)
            model = timm.create_model(tag)
        keys = model.state_dict().keys()
        cfg = model.pretrained_cfg
        assert model.head_hidden_size > 0 and model.num_features > 0
        for layer in (*as_names(cfg['first_conv']), *as_names(cfg['classifier'])):
            assert f'{layer}.weight' in keys, (tag, layer)


@pytest.mark.parametrize('family', list(SMALL))
def test_feature_widths_and_the_headless_model(family):
    """timm's cfg test for token models (the one its ViTs run): `num_features` is the width of forward_features,
    `head_hidden_size` that of forward_head(pre_logits=True); without classifier (reset_classifier(0), or
    num_classes=0) the model returns those pre-logits."""
    model = small_model(family).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = model.forward_features(x)
        pre_logits = model.forward_head(features, pre_logits=True)
        assert features.shape[-1] == model.num_features
        assert pre_logits.shape == (2, model.head_hidden_size)
        model.reset_classifier(0)
        assert model.num_classes == 0
        torch.testing.assert_close(model(x), pre_logits)
        assert small_model(family, num_classes=0).eval()(x).shape == (2, model.head_hidden_size)


# timm's tests/test_models.py picks a model's cfg test by its name: the ViT-like names its NON_STD_FILTERS match take
# test_model_default_cfgs_non_std (token features, the test above), every other name test_model_default_cfgs, written
# for pooled CNNs, which reads a (B, C, H, W) feature map of the cfg's pool_size at inputs up to 448 px
# (MAX_FWD_OUT_SIZE). These are the filters of that list the suite's model names can meet.
TIMM_NON_STD_FILTERS = ('vit_*', 'cait_*', 'deit*')
TIMM_CNN_CFG_MAX_SIZE = 448


def test_models_md_counts_the_tags_timms_cnn_cfg_test_fails_and_why():
    """docs/models.md's count of timm's tests the families fail is timm's rule applied to the suite's registry: the
    tags whose names its filters miss (LV-ViT's and T2T-ViT's), at most 448 px, take the pooled-CNN cfg test, which
    reads the cfg's pool_size and a (B, C, H, W) map of it, where the suite's models, like timm's own ViT that the
    rule spares, have no pool_size and return (B, N, D) tokens."""
    tags = [tag for name in backbones.suite_models() for tag in timm.list_models(name, include_tags=True)]
    cnn_tested = [tag for tag in tags if not any(fnmatch.fnmatch(tag, rule) for rule in TIMM_NON_STD_FILTERS)]
    failing = [tag for tag in cnn_tested if max(get_pretrained_cfg(tag).input_size) <= TIMM_CNN_CFG_MAX_SIZE]
    assert {tag.split('_')[0] for tag in cnn_tested} == {'lvvit', 't2t'} and len(failing) == len(cnn_tested) - 1
    vit = timm.list_models('vit_tiny_patch16_224', include_tags=True)[0]
    assert all(get_pretrained_cfg(tag).pool_size is None for tag in [*failing, vit])
    text = ' '.join((ROOT / 'docs' / 'models.md').read_text().split())
    assert re.search(r'that file fails (\d+) of its tests', text)[1] == str(len(failing))
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for model in (small_model('lvvit'), small_model('t2t_vit'), timm.create_model('vit_tiny_patch16_224', depth=1,
                                                                                     img_size=64)):
            tokens = model.eval().forward_features(x)
            assert tokens.ndim == 3 and tokens.shape[-1] == model.num_features  # (B, N, D): no map to read


def eval_computation(model: torch.nn.Module) -> torch.nn.Module:
    """Dropout and batch-norm as in eval mode, the rest of the model in training mode."""
    for module in model.modules():
        if isinstance(module, (torch.nn.Dropout, torch.nn.BatchNorm2d)):
            module.eval()
    return model


@pytest.mark.parametrize('family', list(SMALL))
def test_training_forward_returns_the_logits_and_every_parameter_gets_a_gradient(family):
    """timm's backward test: in training mode `forward` returns the (B, num_classes) logits, the eval-mode computation
    (LV-ViT's token-labeling outputs, MixToken included, come from `forward_train`), and the backward pass reaches every
    parameter (T2T-ViT's fixed tables are buffers)."""
    model = small_model(family, num_classes=42).train()
    x = torch.randn(2, 3, 64, 64)
    out = model(x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 42)
    out.mean().backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []
    with torch.no_grad():
        torch.testing.assert_close(eval_computation(model)(x), model.eval()(x))


@pytest.mark.parametrize('family', list(SMALL))
def test_torchscript_gives_the_eager_outputs_at_any_input_size(family):
    """timm's TorchScript test (model built scriptable, then scripted), outputs compared with the eager model's, at
    the built size and at another, non-square one (the position table resampled inside the script)."""
    with timm.set_scriptable(True):
        model = small_model(family).eval()
    scripted = torch.jit.script(model)
    with torch.no_grad():
        for size in ((64, 64), (80, 48)):
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(scripted(x), model(x))


def fx_graph(model: torch.nn.Module) -> torch.nn.Module:
    """The model's forward traced by torch.fx as timm's tests and feature extraction trace it (timm's leaf modules and
    functions), with the output node in both modes."""
    tracer_kwargs = dict(leaf_modules=timm.layers.get_notrace_modules(),
                         autowrap_functions=timm.layers.get_notrace_functions(), param_shapes_constant=True)
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    return create_feature_extractor(model, train_return_nodes=train_nodes[-1:], eval_return_nodes=eval_nodes[-1:],
                                    tracer_kwargs=tracer_kwargs)


@pytest.mark.parametrize('family', list(SMALL))
def test_torch_fx_graph_gives_the_eager_outputs_scripted_too_and_gradients(family):
    """timm's torch.fx tests: the traced graph, and the graph scripted, give the eager model's outputs (at a size other
    than the built one too: no input size is baked in), and in training mode its backward pass reaches every
    parameter."""
    with timm.set_scriptable(True):
        model = small_model(family, num_classes=42).eval()
    graph = fx_graph(model)
    scripted = torch.jit.script(graph)
    with torch.no_grad():
        for size in ((64, 64), (80, 48)):
            x = torch.randn(2, 3, *size)
            expected = model(x)
            for run in (graph, scripted):
                (out,) = run(x).values()
                torch.testing.assert_close(out, expected)
    (out,) = graph.train()(torch.randn(2, 3, 64, 64)).values()
    assert out.shape == (2, 42)
    out.mean().backward()
    assert [name for name, p in graph.named_parameters() if p.grad is None] == []
