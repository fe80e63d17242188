"""A frozen dense backbone (`model.backbone.frozen=True`): no gradient and no graph through it, eval mode while the
segmentor trains (drop-path, dropout and batch statistics off), its weights bit-identical after a train_seg run; and
the configs that would still give it a learning rate refused."""
from __future__ import annotations

import pytest
import torch
from mmengine.config import Config

import backbones.dense  # noqa: F401  (registration)
from backbones import create_model
from backbones.common.errors import UsageError
from backbones.dense.backbone import TokenBackbone, check_frozen_backbone
from helpers.commands import run_tool, succeeded
from helpers.seg_data import CONFIGS, TINY_MODELS, write_tiny_ade, write_tiny_config

TINY = TINY_MODELS['upernet_lvvit_s.py']  # LV-ViT: a convolutional stem with batch norms


def tiny_backbone(frozen: bool) -> TokenBackbone:
    torch.manual_seed(0)
    return TokenBackbone('lvvit_s', out_indices=(1, 3), img_size=64, drop_path_rate=0.5, frozen=frozen,
                         model_kwargs=TINY)


def test_a_frozen_backbone_keeps_no_graph_and_stays_in_eval_mode_when_trained():
    frozen, learning = tiny_backbone(True).train(), tiny_backbone(False).eval()
    with torch.no_grad():
        reference = learning(images := torch.randn(2, 3, 64, 64, requires_grad=True))  # the same weights, eval mode
    assert not frozen.training and not any(m.training for m in frozen.modules())
    assert not any(p.requires_grad for p in frozen.parameters())
    stats = {k: v.clone() for k, v in frozen.state_dict().items() if 'running_' in k}
    first, again = frozen(images), frozen(images)
    assert all(not m.requires_grad and m.grad_fn is None for m in first)
    for a, b in zip(first, again):  # no drop-path: the same maps twice
        assert torch.equal(a, b)
    assert all(torch.equal(frozen.state_dict()[k], v) for k, v in stats.items())  # no batch statistics taken
    for a, b in zip(first, reference):  # frozen changes nothing but the mode
        torch.testing.assert_close(a, b)
    learning.train()
    drawn, redrawn = learning(images), learning(images)  # the same backbone learning: drop-path draws differ
    assert all(m.requires_grad for m in drawn) and not all(torch.equal(a, b) for a, b in zip(drawn, redrawn))


@pytest.mark.parametrize('optim_wrapper, says', [
    (dict(constructor='LayerDecayOptimWrapperConstructor', paramwise_cfg=dict(layer_decay_rate=0.9)),
     'LayerDecayOptimWrapperConstructor decays the learning rates of a backbone that does not learn'),
    (dict(paramwise_cfg=dict(custom_keys={'backbone.model': dict(lr_mult=0.1)})),
     r"custom_keys\['backbone.model'\] gives the backbone lr_mult 0.1"),
])
def test_a_frozen_backbone_given_a_learning_rate_is_refused(optim_wrapper, says):
    cfg = Config(dict(model=dict(backbone=dict(type='TokenBackbone', frozen=True)), optim_wrapper=optim_wrapper))
    with pytest.raises(UsageError, match=says):
        check_frozen_backbone(cfg)
    cfg.model.backbone.frozen = False
    check_frozen_backbone(cfg)  # the same optimizer for a backbone that learns


def test_frozen_takes_a_boolean_and_a_backbone_key_without_a_learning_rate():
    with pytest.raises(UsageError, match="model.backbone.frozen must be True or False, got 'False'"):
        TokenBackbone('lvvit_s', out_indices=(1,), img_size=64, frozen='False', model_kwargs=TINY)
    for flag, value in (('final_norm', 'yes'), ('class_token', 1)):
        with pytest.raises(UsageError, match=f'model.backbone.{flag} must be True or False, got {value!r}'):
            TokenBackbone('lvvit_s', out_indices=(1,), img_size=64, model_kwargs=TINY, **{flag: value})
    check_frozen_backbone(Config(dict(model=dict(backbone=dict(type='TokenBackbone', frozen=True)), optim_wrapper=dict(
        paramwise_cfg=dict(custom_keys={'backbone': dict(decay_mult=0.0)})))))  # no lr given: nothing to refuse


@pytest.mark.slow  # train_seg end to end
def test_train_seg_leaves_a_frozen_backbones_weights_bit_identical_and_trains_the_heads(tmp_path):
    torch.manual_seed(1)
    classifier = create_model('lvvit_s', img_size=64, num_classes=0, **TINY)
    weights = tmp_path / 'backbone.pth'
    torch.save(classifier.state_dict(), weights)
    config = write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', write_tiny_ade(tmp_path / 'ade'))
    assert (CONFIGS / 'upernet_lvvit_s.py').is_file()
    trained = succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '2',
                                                  '--cfg-options', 'model.backbone.frozen=True',
                                                  f'model.backbone.pretrained={weights}',
                                                  'default_hooks.checkpoint.interval=1',
                                                  'optim_wrapper.paramwise_cfg.custom_keys.decode_head.lr_mult=10']))
    assert 'is skipped since its requires_grad=False' not in trained.stdout + trained.stderr  # one line a parameter
    states = [torch.load(tmp_path / 'work' / f'iter_{i}.pth', weights_only=False)['state_dict'] for i in (1, 2)]
    for key, value in classifier.state_dict().items():
        if f'backbone.model.{key}' in states[1]:  # the pruned parts (the last norm) are not in the segmentor
            assert torch.equal(states[0][f'backbone.model.{key}'], value), key
            assert torch.equal(states[1][f'backbone.model.{key}'], value), key
    assert sum(key.startswith('backbone.model.') for key in states[1]) >= len(classifier.state_dict()) - 2
    heads = [key for key in states[1] if key.startswith('decode_head.') and states[1][key].is_floating_point()]
    assert any(not torch.equal(states[0][key], states[1][key]) for key in heads)  # the heads did learn


def test_the_frozen_comparison_times_the_frozen_and_linear_steps_against_fine_tuning(monkeypatch):
    """benchmark_dense_step.py --compare frozen: UperNet fine-tuning its backbone is the baseline; the ratios are the
    frozen UperNet's and the linear head's time per step and peak memory over it."""
    from classification.studies.dense import training_step as study

    def step(config: str, device: torch.device, *args, options: dict | None = None) -> study.DenseStep:
        frozen = bool(options) or 'linear' in config
        return study.DenseStep(config, 'semantic', 2, (256, 256), 4.0 if frozen else 2.0, 2.0 if frozen else 1.0,
                               None, 3.0 if frozen else 5.0, 1.0)

    monkeypatch.setattr(study, 'step_in_fresh_process', lambda *a: step(*a[:2], options=a[-1]))
    figures = study.compare_steps(study.FROZEN_VARIANTS, torch.device('cpu'), 1.0, 1, 1)
    assert figures['ratios'] == {name: {'time': 0.5, 'memory': 0.5} for name in ('frozen', 'linear')}  # (3-1)/(5-1)
    assert figures['frozen']['config'] == figures['fine_tuned']['config'] == 'seg_configs/upernet_lvvit_s.py'
    assert study.FROZEN_VARIANTS['frozen'][1] == {'model.backbone.frozen': True}
