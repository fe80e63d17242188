"""backbones.load_checkpoint: release formats, resizing, classifier replacement, and clear failures."""
from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import save_file

import backbones
from backbones import CheckpointError, load_checkpoint
from backbones.common.files import load_weights_only
from backbones.token_head import add_token_head
from backbones.weights import read_state_dict
from helpers.models import damaged_copy, save_release


def tiny(name: str, **kwargs):
    defaults = {'lvvit_s': dict(embed_dim=48, depth=2, num_heads=2), 't2t_vit_14': dict(depth=2),
                'cait_xxs24_224': dict(depth=2), 'deit_small_patch16_224': dict(depth=2)}[name]
    return backbones.create_model(name, **{'img_size': 64, 'num_classes': 10, **defaults, **kwargs}).eval()


def params_equal(a: torch.nn.Module, b: torch.nn.Module, skip=()) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if not k.startswith(skip))


@pytest.mark.parametrize('layout', ['timm_train', 'deit', 'plain'])
def test_release_layouts_round_trip(layout, tmp_path):
    source = tiny('lvvit_s')
    path = save_release(tmp_path / 'ckpt.pth.tar', source.state_dict(), layout)
    target = tiny('lvvit_s')
    load_checkpoint(target, path)
    assert params_equal(source, target)


def test_ema_weights_are_chosen_on_request(tmp_path):
    model, ema = tiny('t2t_vit_14'), tiny('t2t_vit_14')
    path = tmp_path / 'train.pth.tar'
    torch.save({'state_dict': model.state_dict(), 'state_dict_ema': ema.state_dict()}, path)
    target = tiny('t2t_vit_14')
    load_checkpoint(target, path, use_ema=True)
    assert params_equal(target, ema) and not params_equal(target, model)
    load_checkpoint(target, path)
    assert params_equal(target, model)
    torch.save({'state_dict': model.state_dict()}, path)
    with pytest.raises(CheckpointError, match='no EMA state dict'):
        load_checkpoint(target, path, use_ema=True)


def test_safetensors(tmp_path):
    source = tiny('cait_xxs24_224')
    path = tmp_path / 'model.safetensors'
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    target = tiny('cait_xxs24_224')
    load_checkpoint(target, path)
    assert params_equal(source, target)


@pytest.mark.parametrize('name', ['t2t_vit_14', 'cait_xxs24_224', 'lvvit_s', 'deit_small_patch16_224'])
def test_pos_embed_resized_and_classifiers_replaced(name, tmp_path):
    source = tiny(name)
    path = save_release(tmp_path / 'src.pth', source.state_dict(), 'deit')
    target = tiny(name, img_size=96, num_classes=3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    # A classifier for 10 classes never passes for the model's 3 (its place would be taken by a random one) ...
    with pytest.raises(CheckpointError, match='head.weight has 10 classes, the model 3'):
        load_checkpoint(target, path)
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())
    # ... unless a new head is asked for.
    report = load_checkpoint(target, path, new_head=True)
    assert report.resized == ['pos_embed']
    heads = ('head.', 'aux_head.')
    assert report.dropped_classifier and all(k.startswith(heads) for k in report.dropped_classifier)
    assert target.pos_embed.shape[1] == source.pos_embed.shape[1] - 16 + 36  # 4x4 grid -> 6x6, prefix kept
    # Prefix slot (if any) copied verbatim; the new heads kept their fresh initialisation.
    prefix = source.pos_embed.shape[1] - 16
    assert torch.equal(target.pos_embed[:, :prefix], source.pos_embed[:, :prefix])
    assert all(torch.equal(target.state_dict()[k], before[k]) for k in before if k.startswith(heads))
    assert params_equal(source, target, skip=heads + ('pos_embed',))


def test_token_head_is_a_classifier_of_every_family_and_new_head_keeps_fresh_heads(tmp_path):
    """A token-labeled T2T-ViT file (with `aux_head`) loads into a plain T2T-ViT; `new_head` drops fitting heads."""
    source = add_token_head(tiny('t2t_vit_14'))
    path = save_release(tmp_path / 'tl.pth', source.state_dict(), 'timm_train')
    plain = tiny('t2t_vit_14')
    report = load_checkpoint(plain, path)
    assert report.dropped_classifier == ['aux_head.weight', 'aux_head.bias'] and not report.unexpected
    assert torch.equal(plain.head.weight, source.head.weight)  # same class count: the class head is kept

    fresh = tiny('t2t_vit_14')
    head = fresh.head.weight.clone()
    report = load_checkpoint(fresh, path, new_head=True)
    assert sorted(report.dropped_classifier) == ['aux_head.bias', 'aux_head.weight', 'head.bias', 'head.weight']
    assert torch.equal(fresh.head.weight, head) and params_equal(source, fresh, skip=('head.', 'aux_head.'))
    headless = {k: v for k, v in source.state_dict().items() if not k.startswith(('head.', 'aux_head.'))}
    report = load_checkpoint(tiny('t2t_vit_14'), save_release(tmp_path / 'bare.pth', headless, 'plain'),
                             new_head=True)  # a backbone-only export: the missing heads are the fresh ones
    assert not report.missing and not report.dropped_classifier


def test_wrong_shapes_name_the_keys_and_leave_the_model_untouched(tmp_path):
    source = tiny('lvvit_s')
    state = source.state_dict()
    state['blocks.1.mlp.fc1.weight'] = torch.zeros(7, 48)
    del state['blocks.0.norm1.bias']
    state['blocks.5.extra'] = torch.zeros(1)
    path = save_release(tmp_path / 'bad.pth', state, 'plain')
    target = tiny('lvvit_s')
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(target, path)
    message = str(info.value)
    for key in ('blocks.1.mlp.fc1.weight (7, 48)', 'blocks.0.norm1.bias', 'blocks.5.extra', str(path)):
        assert key in message
    assert all(torch.equal(target.state_dict()[k], v) for k, v in before.items())
    report = load_checkpoint(target, path, strict=False)
    assert report.missing == ['blocks.0.norm1.bias'] and report.unexpected == ['blocks.5.extra']
    assert torch.equal(target.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)


def test_checkpoint_of_another_family_fails(tmp_path):
    path = save_release(tmp_path / 't2t.pth', tiny('t2t_vit_14').state_dict(), 'timm_train')
    with pytest.raises(CheckpointError, match='tokens_to_token') as info:
        load_checkpoint(tiny('lvvit_s'), path)
    assert 'missing keys' in str(info.value) and 'patch_embed.conv1.weight' in str(info.value)


def test_missing_and_corrupt_files_are_named(tmp_path):
    model = tiny('lvvit_s')
    with pytest.raises(CheckpointError, match='not found') as info:
        load_checkpoint(model, tmp_path / 'absent.pth')
    assert 'absent.pth' in str(info.value)
    good = save_release(tmp_path / 'good.pth', model.state_dict(), 'plain')
    corrupt = tmp_path / 'corrupt.pth'
    corrupt.write_bytes(good.read_bytes()[: os.path.getsize(good) // 2])
    with pytest.raises(CheckpointError, match='corrupt.pth'):
        load_checkpoint(model, corrupt)


def test_a_byte_flipped_after_saving_is_named_by_every_loader(tmp_path):
    """torch.load reads a checkpoint whose tensor bytes changed after it was written (a disk or copy error) as other
    numbers; the zip's CRC-32s find it: the weight loader, a run's settings and mmengine's loader (segmentation)
    name the file. A file in torch's legacy format records no checksum and loads as before."""
    from mmengine.runner import CheckpointLoader

    import backbones.dense.mmengine_io  # noqa: F401  (the suite's loader for mmengine's local checkpoints)
    from backbones.common.errors import CheckpointReadError
    from classification.engine.checkpoints import read_training_checkpoint
    model = tiny('lvvit_s')
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': model.state_dict(), 'args': {'img_size': 64}, 'meta': {'iter': 4}}, good)
    damaged = damaged_copy(good, tmp_path / 'damaged.pth')
    read_by_torch = torch.load(damaged, weights_only=True)['state_dict']
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in read_by_torch.items())  # no word from torch
    for load in (lambda: load_checkpoint(tiny('lvvit_s'), damaged), lambda: read_training_checkpoint(damaged, True),
                 lambda: CheckpointLoader.load_checkpoint(str(damaged))):
        with pytest.raises(CheckpointReadError, match=rf'{damaged}: damaged: .*data/\d+ does not match the checksum'):
            load()
    load_checkpoint(tiny('lvvit_s'), good)
    legacy = tmp_path / 'legacy.pth'
    torch.save({'state_dict': model.state_dict()}, legacy, _use_new_zipfile_serialization=False)
    fresh = tiny('lvvit_s')
    load_checkpoint(fresh, legacy)
    assert params_equal(fresh, model)


def test_a_pickle_named_safetensors_is_named_with_the_fix(tmp_path):
    """torch.load reads any file named .safetensors as safetensors: the mmengine loader (test_seg, train_seg
    --resume) once let the library's own error through as a traceback."""
    path = tmp_path / 'iter_4.safetensors'
    torch.save({'state_dict': {'x': torch.zeros(1)}}, path)
    with pytest.raises(CheckpointError, match=rf'{path}: not a readable safetensors file .*rename it .pth'):
        load_weights_only(path, 'checkpoint')


@pytest.mark.parametrize('content, said', [
    (b'', 'an empty file'),
    (b'hello world\n', 'a text file'),
    (b'<!DOCTYPE html><html><body>Sign in</body></html>', 'an HTML page'),
    (b'version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n', 'a git-lfs pointer'),
    (bytes([0xff, 0xfe, 0x00, 0x9c]) * 20, 'no format torch writes'),
], ids=['empty', 'text', 'html', 'lfs', 'binary'])
def test_a_file_that_is_no_checkpoint_at_all_is_named_for_what_it_is(tmp_path, content, said):
    """Text, an HTML page, a git-lfs pointer or other bytes under a .pth name: one line saying what the file looks
    like (torch's legacy reader raised a KeyError traceback on text; its weights-only reader blamed Python objects),
    and a read error, so train_seg's resume passes over such a file as over a damaged one."""
    from backbones.common.errors import CheckpointReadError
    path = tmp_path / 'iter_2.pth'
    path.write_bytes(content)
    with pytest.raises(CheckpointReadError, match=rf'{path}: (not a checkpoint: )?{said}'):
        load_weights_only(path, 'checkpoint')


def test_a_segmentors_checkpoint_given_to_a_classifier_loader_is_named_as_one(tmp_path):
    """An mmengine checkpoint (its meta holds mmengine's objects) given where a classifier's is read: named as a
    segmentor's, with the tools that take it, not as a file of unsafe Python objects."""
    from mmengine.logging import HistoryBuffer
    path = tmp_path / 'iter_160.pth'
    torch.save({'meta': {'buffer': HistoryBuffer()}, 'state_dict': tiny('lvvit_s').state_dict()}, path)
    with pytest.raises(CheckpointError, match=rf"{path}: an mmengine checkpoint \(a segmentor's.*tools/test_seg.py"):
        load_checkpoint(tiny('lvvit_s'), path)


class _Payload:
    def __reduce__(self):
        return (os.system, ('echo pwned',))


def test_pickled_code_is_refused(tmp_path):
    path = tmp_path / 'evil.pth'
    torch.save({'state_dict': {'x': torch.zeros(1)}, 'extra': _Payload()}, path)
    with pytest.raises(CheckpointError, match='weights-only'):
        read_state_dict(path)


def test_a_training_checkpoint_of_the_0_based_days_reads_as_the_same_point(tmp_path):
    """Checkpoints count epochs done (1-based, as the logs); one written when `epoch` was timm's 0-based index of the
    last epoch reads as the same number of epochs done. Other files (releases) keep their own `epoch`."""
    from classification.engine.checkpoints import read_training_checkpoint
    torch.save({'state_dict': {}, 'epoch': 2, 'args': {'epochs': 5}}, tmp_path / 'old.pth')
    torch.save({'state_dict': {}, 'epochs_done': 3, 'args': {'epochs': 5}}, tmp_path / 'new.pth')
    torch.save({'state_dict': {}, 'epoch': 299}, tmp_path / 'release.pth')
    old, new = read_training_checkpoint(tmp_path / 'old.pth'), read_training_checkpoint(tmp_path / 'new.pth')
    assert old['epochs_done'] == new['epochs_done'] == 3 and 'epoch' not in old
    assert read_training_checkpoint(tmp_path / 'release.pth')['epoch'] == 299
