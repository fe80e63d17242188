"""The trainer: exact resume after a kill, torchrun (gloo) against one process, evaluation tool, errors."""
import csv
import json
import logging
import re
import shutil
import sys
import time

import pytest
import timm
import torch
import yaml
from timm.data import create_transform

import backbones  # noqa: F401
from backbones.common.errors import CheckpointError, DataError, UsageError
from backbones.common.images import read_image
from backbones.token_head import add_token_head
from classification.data.augment import TrainTransform
from classification.data.folders import ImageFolderDataset
from classification.token_labeling.label_store import TokenLabelStore
from classification.train import main
from helpers.commands import run_tool, run_torchrun, succeeded
from helpers.models import TINY_DEIT
from helpers.training_runs import assert_same_run, last_weights, read_log, resume_killed_run


def train_args(data, labels, output, *extra):
    return [*TINY_DEIT, '--data-dir', str(data), '--token-label-dir', str(labels), '--token-labeling', '--output',
            str(output), '--img-size', '32', '--batch-size', '4', '--lr-base', '1e-3', '--lr-base-batch', '4',
            '--warmup-epochs', '1', '--device', 'cpu', *extra]


@pytest.mark.parametrize('augment', ['pil', 'batched'])
@pytest.mark.slow
def test_killed_run_resumes_to_the_same_losses_and_weights(labeled_images, tmp_path, augment):
    data, labels = labeled_images
    # the full recipe: RandAugment, random erasing, MixToken, drop-path, EMA, two loader processes
    common = ['--epochs', '6', '--workers', '2', '--ema-decay', '0.9', '--drop-path', '0.1', '--augment', augment,
              '--log-interval', '3']
    straight, cut = tmp_path / 'straight', tmp_path / 'cut'
    result = run_tool('train_cls.py', train_args(data, labels, straight, *common))
    assert result.returncode == 0, result.stderr
    # a log line every 3 updates (6 batches an epoch) with the pace, and the epoch's pace in log.jsonl
    steps = re.findall(r'update (\d+)  batch (\d)/6  loss [\d.]+  lr [\d.e+-]+  \d+ img/s  data \d+%  ETA 0:00:\d\d',
                       result.stdout)
    assert [int(update) for update, _ in steps] == list(range(3, 37, 3)) and {b for _, b in steps} == {'3', '6'}
    assert all(r['img_s'] > 0 and 0 <= r['data_wait'] <= 1 for r in read_log(straight).values())
    resume_killed_run('train_cls.py', train_args(data, labels, cut, *common), cut)
    assert_same_run(straight, cut, epochs=6)
    metrics = json.loads((cut / 'metrics.json').read_text())
    assert metrics['epochs'] == 6 and metrics['top1'] == read_log(straight)[6]['top1']


# No randomness in the data or the forward: runs that differ only in how they compute must agree.
DETERMINISTIC = ['--epochs', '2', '--workers', '0', '--auto-augment', 'none', '--hflip', '0', '--scale-min', '1',
                 '--reprob', '0', '--mix-token', '0', '--drop-path', '0', '--ema-decay', '0', '--interpolation',
                 'bilinear']


@pytest.mark.slow
def test_two_gloo_processes_agree_with_one(labeled_images, tmp_path):
    data, labels = labeled_images
    main(train_args(data, labels, tmp_path / 'one', *DETERMINISTIC))
    two = train_args(data, labels, tmp_path / 'two', *DETERMINISTIC)
    two[two.index('--batch-size') + 1] = '2'  # the same global batch of 4
    run_torchrun('train_cls.py', two, processes=2)
    assert_same_run(tmp_path / 'one', tmp_path / 'two', epochs=2, exact=False, images=12)


@pytest.mark.parametrize('augment', ['pil', 'batched'])
def test_the_number_of_loader_workers_does_not_change_the_training(labeled_images, tmp_path, augment):
    """Each image's augmentation (crop, flip, RandAugment, random erasing) is drawn from streams seeded from the run's
    seed, the epoch and its place in the pass, in whichever process reads it; without workers the training process
    reads the batches and its own streams (MixToken, drop-path) are put back after each (the device half draws from
    each batch's own seed). --workers 0 and --workers 2 train alike, bit for bit: a job requeued on a node of
    another size (another default --workers) trains on as it would have."""
    data, labels = labeled_images
    common = ['--epochs', '1', '--ema-decay', '0.9', '--drop-path', '0.1', '--augment', augment]
    for workers in ('0', '2'):
        main(train_args(data, labels, tmp_path / workers, *common, '--workers', workers))
    assert_same_run(tmp_path / '0', tmp_path / '2', epochs=1)


def test_grad_checkpointing_option_trains_to_the_same_weights(labeled_images, tmp_path):
    """--grad-checkpointing recomputes the blocks in the backward pass: the same losses and weights."""
    data, labels = labeled_images
    main(train_args(data, labels, tmp_path / 'plain', *DETERMINISTIC))
    main(train_args(data, labels, tmp_path / 'checkpointed', *DETERMINISTIC, '--grad-checkpointing'))
    assert_same_run(tmp_path / 'plain', tmp_path / 'checkpointed', epochs=2, exact=False)


def test_eval_tool_matches_an_independent_evaluation(labeled_images, tmp_path):
    data, labels = labeled_images
    out = tmp_path / 'run'
    main(train_args(data, labels, out, '--epochs', '2', '--workers', '0'))
    result = run_tool('eval_cls.py', [*TINY_DEIT, '--checkpoint', str(out / 'last.pth'), '--data-dir', str(data),
                                         '--img-size', '32', '--workers', '0', '--json', str(tmp_path / 'eval.json')])
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads((tmp_path / 'eval.json').read_text())

    model = add_token_head(timm.create_model('deit_small_patch16_224', num_classes=3, img_size=32, embed_dim=32,
                                             depth=2, num_heads=2)).eval()
    model.load_state_dict(last_weights(out))
    cfg = model.pretrained_cfg
    transform = create_transform(32, interpolation=cfg['interpolation'], crop_pct=cfg['crop_pct'],
                                 mean=cfg['mean'], std=cfg['std'])
    correct = total = 0
    for label, name in enumerate(sorted(p.name for p in (data / 'val').iterdir())):
        for path in sorted((data / 'val' / name).iterdir()):
            x = transform(read_image(path))[None]
            with torch.no_grad():
                f = model.forward_features(x)
                logits = model.head(f[:, 0]) + 0.5 * model.aux_head(f[:, 1:]).max(dim=1).values
            correct += int(logits.argmax().item() == label)
            total += 1
    assert reported['images'] == total
    assert reported['top1'] == pytest.approx(100 * correct / total)
    assert reported['top1'] == pytest.approx(read_log(out)[2]['top1'])


def test_max_images_keeps_each_class_its_share_of_the_split(labeled_images):
    data, labels = labeled_images
    whole = ImageFolderDataset(data, 'train', TrainTransform(32))
    assert whole.labels.tolist() == [0] * 8 + [1] * 8 + [2] * 8  # listed class by class
    part = ImageFolderDataset(data, 'train', TrainTransform(32), label_store=TokenLabelStore(labels), max_images=6)
    # every fourth: two of each class, not the first class alone
    assert list(part.paths) == list(whole.paths)[::4] and part.labels.tolist() == whole.labels.tolist()[::4]
    assert ImageFolderDataset(data, 'train', TrainTransform(32), max_images=100).paths == whole.paths


def test_train_images_is_recorded_and_kept_on_resume(labeled_images, tmp_path):
    data, labels = labeled_images
    run = ['--epochs', '1', '--workers', '0', '--log-interval', '1']
    metrics = main(train_args(data, labels, tmp_path, *run, '--train-images', '6'))
    assert metrics['train_images'] == 6 and len(read_log(tmp_path)) == 1
    (tmp_path / 'metrics.json').unlink()  # as a run stopped after its last checkpoint: one finished is not resumed
    with pytest.raises(UsageError, match='train_images=6.*train_images=8'):
        main(train_args(data, labels, tmp_path, *run, '--train-images', '8', '--resume'))


def test_unknown_model_lists_suite_models(tmp_path):
    with pytest.raises(UsageError, match='lvvit_s'):
        main(['lvvit_small', '--output', str(tmp_path)])


def test_token_labeling_recipe_needs_labels(labeled_images, tmp_path):
    data, _ = labeled_images
    with pytest.raises(UsageError, match='--token-label-dir'):
        main(['lvvit_t', '--data-dir', str(data), '--output', str(tmp_path), '--device', 'cpu'])


@pytest.mark.slow
def test_compiled_steps_train_like_eager_ones(labeled_images, tmp_path):
    """--compile (torch.compile of the training and evaluation steps): the same losses, results and weights."""
    data, labels = labeled_images
    main(train_args(data, labels, tmp_path / 'eager', *DETERMINISTIC))
    torch._dynamo.reset()
    main(train_args(data, labels, tmp_path / 'compiled', *DETERMINISTIC, '--compile'))
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] > 0  # the steps did run compiled
    assert_same_run(tmp_path / 'eager', tmp_path / 'compiled', epochs=2, exact=False)
    assert read_log(tmp_path / 'compiled')[2]['top1'] == read_log(tmp_path / 'eager')[2]['top1']


@pytest.mark.slow
def test_batched_augmentation_trains_like_the_pil_path(labeled_images, tmp_path):
    """--augment batched (workers cut regions, the device augments batches): with the draws fixed, the same training
    as the PIL path up to resampling differences, token targets included."""
    data, labels = labeled_images
    main(train_args(data, labels, tmp_path / 'pil', *DETERMINISTIC, '--augment', 'pil'))
    main(train_args(data, labels, tmp_path / 'batched', *DETERMINISTIC, '--augment', 'batched'))
    pil, batched = read_log(tmp_path / 'pil'), read_log(tmp_path / 'batched')
    for epoch in (1, 2):
        assert batched[epoch]['train_loss'] == pytest.approx(pil[epoch]['train_loss'], rel=1e-3), epoch
        assert batched[epoch]['train_loss'] != pil[epoch]['train_loss']  # the batched path did run


@pytest.mark.parametrize('preset', ['token-labeling', 'relabel'])
def test_overlapped_loop_trains_like_the_serial_one(labeled_images, tmp_path, monkeypatch, preset):
    """Batches prepared two ahead by the prefetcher's thread (their map targets made before the forward) against
    --serial-loop (targets made in the loss), with every random draw of the full recipe on the batched path
    (RandAugment, random erasing's noise on the device, MixToken or CutMix, drop-path, EMA, two loader workers):
    the same losses and weights, bit for bit."""
    from classification.objectives.objective import MapTargetObjective
    data, labels = labeled_images
    made_ahead = []
    targets_ahead = MapTargetObjective.targets_ahead

    def spy(self, batch, device):
        ready = targets_ahead(self, batch, device)
        made_ahead.append('map_targets' in ready)
        return ready

    monkeypatch.setattr(MapTargetObjective, 'targets_ahead', spy)
    common = ['--preset', preset, '--epochs', '2', '--workers', '2', '--ema-decay', '0.9', '--drop-path', '0.1',
              '--augment', 'batched']
    args = [arg for arg in train_args(data, labels, tmp_path / 'overlapped', *common) if arg != '--token-labeling']
    main(args)
    assert made_ahead and all(made_ahead[1:])  # every batch after the first (whose forward gives the token grid)
    made_ahead.clear()
    args[args.index('--output') + 1] = str(tmp_path / 'serial')
    main([*args, '--serial-loop'])
    assert not made_ahead
    assert_same_run(tmp_path / 'overlapped', tmp_path / 'serial', epochs=2)


def test_four_accumulated_batches_of_8_update_like_one_batch_of_32():
    """--grad-accum-steps: gradients of 4 batches of 8 summed (each loss / 4) give the update of one batch of 32, for
    two updates in a row (the gradients are cleared between them)."""
    import copy

    from backbones.common.distributed import DistInfo
    from classification.engine.steps import PassOptions, train_one_epoch
    from classification.engine.trainer import Optimization, optimization_state
    from classification.objectives.objective import LabelObjective
    model = timm.create_model('deit_small_patch16_224', num_classes=3, img_size=32, embed_dim=32, depth=2,
                              num_heads=2)  # layer norms only: no batch statistics
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    images, labels = torch.randn(64, 3, 32, 32), torch.randint(0, 3, (64,))
    objective = LabelObjective(3, 0.1)
    for m, size, accumulate in ((model, 32, 1), (twin, 8, 4)):
        state, _ = optimization_state(m, m, Optimization('momentum', 0.5, 0.0, epochs=1), 2, 'none')
        batches = [{'image': images[i:i + size], 'label': labels[i:i + size], 'skipped': 0} for i in range(0, 64, size)]
        train_one_epoch(m, batches, objective, state, DistInfo(), PassOptions(accumulate=accumulate))
        assert state.num_updates == 2
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5, msg=name)
    assert not torch.equal(model.head.weight, start.head.weight)  # the updates did happen


def test_each_loss_is_read_after_the_next_step_is_queued_and_a_loss_that_is_not_finite_stops_the_pass():
    """Nothing between two updates waits for the device: step n's loss is read on the host only once step n+1 has
    been queued (a pass's first step and its end read their own). The pass's mean is every step's loss, and the log
    reports the latest read; a NaN loss stops the pass at the next step, naming the update it came from."""
    from backbones.common.distributed import DistInfo
    from classification.engine import steps as steps_module
    from classification.engine.trainer import Optimization, optimization_state
    from classification.objectives.objective import LabelObjective

    events = []

    class RecordingObjective(LabelObjective):
        def loss(self, output, batch, targets, device):
            loss = super().loss(output, batch, targets, device)
            events.append(('step', loss.item()))
            return loss * batch['scale'] if 'scale' in batch else loss

    def recorded_read(self):
        value = original_read(self)
        events.append(('read', value))
        return value

    original_read = steps_module.PendingLoss.read
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3))
    batches = [{'image': torch.randn(4, 3, 4, 4), 'label': torch.randint(0, 3, (4,)), 'skipped': 0} for _ in range(5)]
    state, _ = optimization_state(model, model, Optimization('momentum', 0.1, 0.0, epochs=1), 5, 'none')
    logged = []
    steps_module.PendingLoss.read = recorded_read
    try:
        result = steps_module.train_one_epoch(model, batches, RecordingObjective(3, 0.0), state, DistInfo(),
                                              hooks=steps_module.PassHooks(log=logged.append))
        losses = [value for kind, value in events if kind == 'step']
        assert [kind for kind, _ in events] == ['step', 'read', 'step'] + ['step', 'read'] * 3 + ['read']
        assert [value for kind, value in events if kind == 'read'] == losses  # each one, in order
        assert result.loss == pytest.approx(sum(losses) / 5, rel=1e-12)
        assert [s.loss for s in logged] == [losses[0], *losses[:4]]  # the first step's own, then one step late

        events.clear()
        batches[2]['scale'] = torch.tensor(float('nan'))
        state, _ = optimization_state(model, model, Optimization('momentum', 0.1, 0.0, epochs=1), 5, 'none')
        with pytest.raises(FloatingPointError, match='loss is nan at update 2;'):
            steps_module.train_one_epoch(model, batches, RecordingObjective(3, 0.0), state, DistInfo())
        assert [kind for kind, _ in events].count('step') == 4  # found when the step after it was queued
    finally:
        steps_module.PendingLoss.read = original_read


def test_processes_agree_on_a_stop_one_round_late():
    """The preemption hook's agreement under torchrun: each exchange starts summing its values and returns what the
    previous one summed (zeros at first), so no update waits for the device to read a sum."""
    from backbones.common.distributed import DistInfo, LaggingSum
    agreement = LaggingSum(DistInfo(), 2)
    assert agreement.exchange([1.0, 0.0]) == [0.0, 0.0]
    assert agreement.exchange([0.0, 1.0]) == [1.0, 0.0]
    assert agreement.read() == [0.0, 1.0]


def test_the_pace_counts_the_time_spent_waiting_for_batches():
    """A loader that sleeps 0.1 s before each batch of 8: the pass counts at least those 0.4 s as waiting for data,
    runs at most 80 images/s, and the time left falls to 0 at the last batch. (Bounds the sleeps guarantee, not
    shares of wall-clock time: a busy machine stretches the steps, never the sleeps' minimum.)"""
    from backbones.common.distributed import DistInfo
    from classification.engine.steps import PassHooks, train_one_epoch
    from classification.engine.trainer import Optimization, optimization_state
    from classification.objectives.objective import LabelObjective

    class SlowLoader:
        def __len__(self):
            return 4

        def __iter__(self):
            for _ in range(4):
                time.sleep(0.1)
                yield {'image': torch.randn(8, 3, 8, 8), 'label': torch.randint(0, 3, (8,)), 'skipped': 0}

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(192, 3))
    state, _ = optimization_state(model, model, Optimization('momentum', 0.1, 0.0, epochs=1), 4, 'none')
    steps = []
    result = train_one_epoch(model, SlowLoader(), LabelObjective(3, 0.0), state, DistInfo(),
                             hooks=PassHooks(log=steps.append))
    assert [(s.update, s.batch, s.batches) for s in steps] == [(1, 1, 4), (2, 2, 4), (3, 3, 4), (4, 4, 4)]
    assert steps[-1].seconds_left == 0 and steps[0].seconds_left / 3 >= 0.1  # the first batch's 0.1 s, 3 times over
    seconds = 32 / result.images_per_second
    assert seconds >= 0.4 and result.data_wait * seconds >= 0.4 and 0 < result.data_wait <= 1


@pytest.mark.slow
def test_grad_accum_steps_trains_like_the_whole_global_batch(labeled_images, tmp_path):
    """train_cls.py --batch-size 3 --grad-accum-steps 4 against --batch-size 12: the same lr (global batch 12), the
    same updates, losses and weights."""
    data, labels = labeled_images
    whole = train_args(data, labels, tmp_path / 'whole', *DETERMINISTIC)
    whole[whole.index('--batch-size') + 1] = '12'
    main(whole)
    accumulated = train_args(data, labels, tmp_path / 'accumulated', *DETERMINISTIC, '--grad-accum-steps', '4')
    accumulated[accumulated.index('--batch-size') + 1] = '3'
    main(accumulated)
    assert_same_run(tmp_path / 'whole', tmp_path / 'accumulated', epochs=2, exact=False)
    checkpoint = torch.load(tmp_path / 'accumulated' / 'last.pth', weights_only=True)
    assert checkpoint['num_updates'] == 4 and checkpoint['args']['grad_accum_steps'] == 4
    (tmp_path / 'accumulated' / 'metrics.json').unlink()  # as a run stopped after its last checkpoint
    with pytest.raises(UsageError, match='grad_accum_steps=4'):
        main([*accumulated, '--resume', '--grad-accum-steps', '2'])


@pytest.mark.slow
def test_a_run_records_its_settings_relaunches_from_them_and_logs_to_its_trackers(labeled_images, tmp_path,
                                                                                    monkeypatch, caplog):
    """args.yaml holds the resolved settings and `--config` relaunches the same run bit for bit; summary.csv is
    log.jsonl as a table; wandb (offline) and MLflow (a file store) received the run's settings and each epoch's
    figures. With an EMA, the EMA is the run's model: best.pth is its best epoch, and every loader takes it."""
    from backbones.weights import read_state_dict
    from classification.engine.checkpoints import read_run_args
    from helpers.trackers import mlflow_run, wandb_history
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_SILENT', 'true')
    monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
    data, labels = labeled_images
    first, again = tmp_path / 'first', tmp_path / 'again'
    caplog.set_level(logging.INFO, logger='vit_dense')
    done = main(train_args(data, labels, first, *DETERMINISTIC, '--epochs', '3', '--ema-decay', '0.5'))
    # the last line leads with the run's model, the EMA the checkpoints hold, and names the trained weights' after
    assert (f'done: top-1 {done["ema_top1"]:.2f}%  top-5 {done["ema_top5"]:.2f}% (the EMA, which the checkpoints '
            f'hold; the trained weights {done["top1"]:.2f}%') in caplog.text
    settings = read_run_args(first / 'args.yaml', 'train_cls.py')
    assert settings['model'] == 'deit_small_patch16_224' and settings['ema_decay'] == 0.5
    assert settings['epochs'] == 3 and settings['smoothing'] == 0.1 and settings['mixup'] == 0.8  # resolved
    main(['--config', str(first / 'args.yaml'), '--output', str(again), '--log-wandb', '--log-mlflow'])
    assert_same_run(first, again, epochs=3)
    assert read_run_args(again / 'args.yaml', 'train_cls.py') == {**settings, 'output': str(again), 'log_wandb': True,
                                                                    'log_mlflow': True}

    log = read_log(first)
    with open(first / 'summary.csv') as f:
        rows = list(csv.DictReader(f))
    assert [float(row['ema_top1']) for row in rows] == [log[e]['ema_top1'] for e in (1, 2, 3)]
    assert [int(row['epoch']) for row in rows] == [1, 2, 3]

    best_epoch = max(log, key=lambda e: (log[e]['ema_top1'], -e))  # the first epoch of the best EMA top-1
    best, last = (torch.load(first / name, weights_only=True) for name in ('best.pth', 'last.pth'))
    assert best['epochs_done'] == best_epoch and best['weights'] == last['weights'] == 'ema'
    assert best['architecture']['model'] == 'deit_small_patch16_224'
    assert best['architecture']['kwargs'] == {'embed_dim': 32, 'depth': 2, 'num_heads': 2, 'drop_path_rate': 0.0}
    assert 'state_dict_trained' not in best and not torch.equal(last['state_dict_trained']['head.weight'],
                                                                last['state_dict']['head.weight'])
    assert torch.equal(read_state_dict(first / 'last.pth', use_ema=False)['head.weight'],
                       last['state_dict_trained']['head.weight'])
    with pytest.raises(CheckpointError, match="best.pth holds only its run's model, the EMA .*in the run's last.pth"):
        read_state_dict(first / 'best.pth', use_ema=False)  # --trained-weights
    for path in (first / 'best.pth', first / 'last.pth'):  # the suite's default, timm's either way: the EMA
        ema = read_state_dict(path, use_ema=True)
        for loaded in (read_state_dict(path), timm.models.load_state_dict(str(path), use_ema=False),
                       timm.models.load_state_dict(str(path), use_ema=True)):
            assert all(torch.equal(loaded[k], ema[k]) for k in ema)

    metrics, params = mlflow_run(again / 'mlruns', (again / 'mlflow_run_id').read_text().strip())
    assert [value for _, value in metrics['epoch/ema_top1']] == [log[e]['ema_top1'] for e in (1, 2, 3)]
    assert params['ema_decay'] == '0.5' and params['model'] == 'deit_small_patch16_224'
    history, config = wandb_history(again)
    logged = {row['epoch']: row['epoch/top1'] for row in history if 'epoch/top1' in row}
    assert logged == {e: log[e]['top1'] for e in (1, 2, 3)} and config['ema_decay'] == 0.5


def test_an_args_yaml_of_another_kind_and_a_missing_tracker_are_named(labeled_images, tmp_path, monkeypatch):
    """--config refuses what is not a whole train_cls args.yaml of this layout, naming the file and why, and the
    options that choose a recipe (the file holds one resolved); a tracker whose client is not installed names the
    extra that installs it, before any work."""
    from classification.engine.checkpoints import read_run_args
    data, labels = labeled_images
    main(train_args(data, labels, tmp_path / 'first', *DETERMINISTIC, '--epochs', '1'))
    written = read_run_args(tmp_path / 'first' / 'args.yaml', 'train_cls.py')
    written = {'command': 'train_cls.py', 'args_version': 1, **written}
    with pytest.raises(UsageError, match='--preset chooses a recipe, and --config .* holds'):
        main(['--config', str(tmp_path / 'first' / 'args.yaml'), '--preset', 'cutmix-label'])
    cases = {'another layout': ({**written, 'args_version': 0}, 'layout 0'),
             'another command': ({**written, 'command': 'transfer_cifar.py'}, 'transfer_cifar.py run'),
             'a setting unknown here': ({**written, 'ema_rule': 'x'}, 'does not have: ema_rule'),
             'a value out of range': ({**written, 'epochs': -2}, '--epochs')}
    cases['a file cut short'] = ({key: written[key] for key in list(written)[:4]}, 'settings missing: ')
    for case, (values, says) in cases.items():
        (tmp_path / 'args.yaml').write_text(yaml.safe_dump(values))
        with pytest.raises(DataError) as raised:
            main(['--config', str(tmp_path / 'args.yaml'), '--output', str(tmp_path / 'run')])
        assert says in str(raised.value) and str(tmp_path / 'args.yaml') in str(raised.value), case
    (tmp_path / 'args.yaml').write_bytes(b'\x00\xff: [')
    with pytest.raises(DataError, match='not a YAML file'):
        main(['--config', str(tmp_path / 'args.yaml')])
    monkeypatch.setitem(sys.modules, 'wandb', None)  # an import of it fails, as where the extra is not installed
    needs = re.escape('--log-wandb needs wandb, which does not import here') + r'.*pip install .\.\[wandb\].'
    with pytest.raises(UsageError, match=needs):
        main(train_args(data, labels, tmp_path / 'run', '--log-wandb'))
    assert not (tmp_path / 'run').exists()


def test_timms_flag_names_are_taken_and_its_other_flags_named(capsys):
    """timm's names (--aa, --model-ema, --model-ema-decay, --torchcompile) set what the suite's do; a flag of timm's
    scripts the suite does not take stops the command with one line naming its equivalent."""
    from classification.evaluate import main as eval_cls
    from classification.recipes import resolve_recipe
    from classification.train import build_parser
    parse = build_parser().parse_args
    args = parse(['deit_small_patch16_224', '--aa', 'rand-m9-mstd0.5', '--model-ema-decay', '0.9', '--torchcompile'])
    assert (args.auto_augment, args.ema_decay, args.compile) == ('rand-m9-mstd0.5', 0.9, 'inductor')
    no_ema = {'ema_decay': 0.0}  # a recipe without an EMA (the embedded data's)
    assert resolve_recipe(parse(['deit_small_patch16_224']), no_ema).ema_decay == 0
    assert resolve_recipe(parse(['deit_small_patch16_224', '--model-ema']), no_ema).ema_decay == 0.9998
    assert resolve_recipe(parse(['deit_small_patch16_224', '--model-ema', '--model-ema-decay', '0.99']),
                          no_ema).ema_decay == 0.99
    for command, flag, says in ((main, '--initial-checkpoint', "timm's train.py; train_cls.py does not take it: use "
                                                               "--finetune CKPT"),
                                (eval_cls, '--results-file', "timm's validate.py; eval_cls.py does not take it: use "
                                                             "--json")):
        with pytest.raises(SystemExit):
            command(['deit_small_patch16_224', flag, 'x'])
        assert f'{flag} is a flag of {says}' in capsys.readouterr().err


def test_layer_decay_groups_the_model_by_layer_with_the_classifier_first_at_the_recipe_lr():
    """--layer-decay (timm's name, formerly refused): timm's layer-wise groups of the classifier, the top layer's
    first (the lr the log shows is the recipe's), every block at the rate times the lr of the one above."""
    from classification.engine.trainer import optimization_state
    from classification.recipes import resolve_recipe
    from classification.train import build_parser
    recipe = resolve_recipe(build_parser().parse_args(['deit_small_patch16_224', '--layer-decay', '0.75']))
    optimization = recipe.optimization(512)
    model = timm.create_model('deit_small_patch16_224', num_classes=3, img_size=32, embed_dim=32, depth=3,
                              num_heads=2)
    state, _ = optimization_state(model, model, optimization, 2, 'none')
    groups = state.optimizer.param_groups  # each group's peak: its schedule's base times the lr_scale it applies
    lr_of = {id(p): group['initial_lr'] * group['lr_scale'] for group in groups for p in group['params']}
    assert lr_of[id(groups[0]['params'][0])] == pytest.approx(optimization.lr) and optimization.layer_decay == 0.75
    assert lr_of[id(model.head.weight)] == pytest.approx(optimization.lr)
    blocks = [lr_of[id(model.blocks[i].attn.qkv.weight)] for i in range(3)]
    assert blocks == pytest.approx([optimization.lr * 0.75 ** (3 - i) for i in range(3)])
    assert lr_of[id(model.pos_embed)] == pytest.approx(optimization.lr * 0.75 ** 4)
    assert len(lr_of) == len(list(model.parameters()))


def written_args_yaml(folder, *argv):
    """The args.yaml tools/train_cls.py writes for the command line `argv` (as `main` resolves it), without a run."""
    from classification.digits.cls_data import EmbeddedScans
    from classification.engine.checkpoints import write_run_args
    from classification.engine.trainer import run_settings
    from classification.recipes import resolve_recipe
    from classification.train import build_parser
    args = build_parser(EmbeddedScans).parse_args([*argv, '--data-dir', str(folder)])
    folder.mkdir(parents=True, exist_ok=True)
    write_run_args(folder, 'train_cls.py', run_settings(args, resolve_recipe(args)))
    return folder / 'args.yaml'


def test_a_model_typed_with_config_is_one_line_saying_the_file_gives_it(tmp_path):
    """`train_cls.py lvvit_t --config RUN/args.yaml`: one line saying the model is the file's and how to train
    another (argparse's usage block said 'unrecognized arguments: lvvit_t'); the file's own model typed again
    passes."""
    from classification.digits.cls_data import EmbeddedScans
    from classification.engine.trainer import parse_run_arguments
    from classification.train import build_parser
    config = written_args_yaml(tmp_path / 'first', *TINY_DEIT, '--epochs', '3')
    result = run_tool('train_cls.py', ['lvvit_t', '--config', config])
    assert result.returncode == 2 and result.stdout == ''
    assert result.stderr.strip().splitlines() == [
        f'error: lvvit_t: --config {config} gives the model of its run (deit_small_patch16_224), for which its recipe '
        f'was resolved; it cannot be changed on the command line: to train lvvit_t, give it without --config  '
        f'(--debug shows the traceback)']
    again = parse_run_arguments(build_parser(EmbeddedScans), ['deit_small_patch16_224', '--config', str(config),
                                                              '--epochs', '4'])
    assert (again.model, again.epochs, again.model_kwargs) == ('deit_small_patch16_224', 4, TINY_DEIT[2:])


def test_an_args_yaml_from_before_the_added_settings_runs_as_it_did_and_a_cut_one_is_refused(tmp_path):
    """An args.yaml written before --layer-decay, --frozen and --fast-decode existed relaunches with each off (as its
    run trained); a file missing any other setting is still refused, naming it."""
    import yaml

    from backbones.common.errors import DataError
    from classification.digits.cls_data import EmbeddedScans
    from classification.engine.checkpoints import ADDED_SETTINGS
    from classification.engine.trainer import parse_run_arguments
    from classification.recipes import resolve_recipe
    from classification.train import build_parser
    config = written_args_yaml(tmp_path / 'run', *TINY_DEIT, '--layer-decay', '0.5', '--fast-decode')
    written = yaml.safe_load(config.read_text())
    assert (written['layer_decay'], written['frozen'], written['fast_decode']) == (0.5, False, True)
    older = {key: value for key, value in written.items() if key not in ADDED_SETTINGS}
    config.write_text(yaml.safe_dump(older, sort_keys=False))
    args = parse_run_arguments(build_parser(EmbeddedScans), ['deit_small_patch16_224', '--config', str(config)])
    recipe = resolve_recipe(args)
    assert (recipe.layer_decay, recipe.frozen, args.fast_decode, recipe.epochs) == (None, False, False,
                                                                                   written['epochs'])
    config.write_text(yaml.safe_dump({key: value for key, value in older.items() if key != 'epochs'}))
    with pytest.raises(DataError, match='settings missing: epochs$'):
        parse_run_arguments(build_parser(EmbeddedScans), ['deit_small_patch16_224', '--config', str(config)])


def test_two_names_of_one_setting_with_different_values_are_refused(tmp_path):
    """An option and its alias (timm's --aa, --model-ema-decay) or a flag and its --no- form, typed with different
    values: one line naming both (argparse kept the last silently); the same value under both passes. Typed after
    --config, either name overrides the file's value."""
    from classification.digits.cls_data import EmbeddedScans
    from classification.engine.trainer import parse_run_arguments
    from classification.train import build_parser

    def parse(*argv):
        return parse_run_arguments(build_parser(EmbeddedScans), list(argv))

    for twins, says in (
            (['--aa', 'rand-m9-mstd0.5', '--auto-augment', 'rand-m7'],
             "--aa rand-m9-mstd0.5 and --auto-augment rand-m7 set one setting (auto_augment) to different values"),
            (['--ema-decay', '0.99', '--model-ema-decay', '0.5'],
             '--ema-decay 0.99 and --model-ema-decay 0.5 set one setting (ema_decay) to different values'),
            (['--token-labeling', '--no-token-labeling'],
             '--token-labeling and --no-token-labeling set one setting (token_labeling) to different values')):
        with pytest.raises(UsageError, match=re.escape(says) + ': give one of them$'):
            parse(*TINY_DEIT, *twins)
    assert parse(*TINY_DEIT, '--ema-decay', '0.5', '--model-ema-decay', '.50', '--epochs', '2', '--epochs', '3'
                 ).ema_decay == 0.5  # the same value twice; and one name given twice keeps argparse's rule
    assert parse(*TINY_DEIT, '--compile', '--torchcompile').compile  # a flag and its twin's bare form say the same
    config = written_args_yaml(tmp_path / 'first', *TINY_DEIT, '--aa', 'rand-m9-mstd0.5', '--ema-decay', '0.9')
    relaunched = parse('--config', str(config), '--aa', 'rand-m7', '--model-ema-decay', '0.5')
    assert (relaunched.auto_augment, relaunched.ema_decay) == ('rand-m7', 0.5)
    with pytest.raises(UsageError, match=re.escape('--model-ema-decay 0.5 and --ema-decay 0.7 set one setting')):
        parse('--config', str(config), '--model-ema-decay', '0.5', '--ema-decay', '0.7')


def test_a_tracker_that_cannot_start_is_refused_before_the_data_and_leaves_nothing(labeled_images, tmp_path,
                                                                                  monkeypatch, wandb_without_login):
    """wandb online without a login: one line naming --log-wandb before the token-label store is opened or the
    split listed, and no run folder (it left args.yaml, tensorboard/ and the wandb_id of a run that never started);
    an MLflow run the store does not hold (a folder's kept id): what the folder held alone stays. A run that fails
    after its trackers started leaves no tracker run running (MLflow's: KILLED, not RUNNING)."""
    import gc

    from backbones.common.errors import TrackerError
    from classification import train as trainer_module
    from classification.data import folders
    data, labels = labeled_images
    read = []
    for module, name in ((folders, 'open_split'), (trainer_module, 'open_store')):
        monkeypatch.setattr(module, name, lambda *a, read_data=getattr(module, name), **k: read.append(a) or
                            read_data(*a, **k))
    with pytest.raises(TrackerError, match=r'^--log-wandb: wandb could not start its run .*: UsageError: No API key'):
        main(train_args(data, labels, tmp_path / 'new' / 'run', '--log-wandb', '--epochs', '1'))
    assert read == [] and not (tmp_path / 'new').exists()

    monkeypatch.delenv('MLFLOW_TRACKING_URI', raising=False)
    kept = tmp_path / 'kept'
    kept.mkdir()
    (kept / 'mlflow_run_id').write_text('0123456789abcdef\n')
    with pytest.raises(TrackerError, match=r'^--log-mlflow: MLflow run 0123456789abcdef \(kept in .*mlflow_run_id\) '
                                           r'in the store file://'):
        main(train_args(data, labels, kept, '--log-mlflow', '--epochs', '1'))
    assert read == [] and [path.name for path in kept.iterdir()] == ['mlflow_run_id']

    from mlflow.tracking import MlflowClient
    store = (tmp_path / 'store').resolve().as_uri()
    monkeypatch.setenv('MLFLOW_TRACKING_URI', store)
    with pytest.raises(DataError):  # a split without images, found after the trackers started
        main(train_args(data, labels, tmp_path / 'failed', '--log-mlflow', '--train-images', '1'))
    gc.collect()  # the failed run's objects, the traceback's frames dropped
    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name('train_cls').experiment_id])
    assert read and [run.info.status for run in runs] == ['KILLED'] and not (tmp_path / 'failed').exists()


def test_a_run_refused_while_its_data_is_read_leaves_its_folder_as_it_was(labeled_images, tmp_path):
    """A data error found once the trackers have started (a validation class the training split lacks, a token-label
    store of other images) left an empty --output folder, or a resumed run's folder with a new TensorBoard file."""
    data, labels = labeled_images
    odd = tmp_path / 'odd'
    shutil.copytree(data, odd)
    shutil.copytree(odd / 'val' / 'n001', odd / 'val' / 'n009')
    with pytest.raises(DataError, match='class folder'):
        main(train_args(odd, labels, tmp_path / 'new' / 'run', '--epochs', '1'))
    assert not (tmp_path / 'new').exists()
    main(train_args(data, labels, tmp_path / 'run', '--epochs', '1', '--workers', '0'))
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / 'run').rglob('*')}
    (tmp_path / 'run' / 'metrics.json').rename(tmp_path / 'metrics.json')  # as a run stopped after its checkpoint
    del before[tmp_path / 'run' / 'metrics.json']
    with pytest.raises(DataError, match='class folder'):
        main(train_args(odd, labels, tmp_path / 'run', '--epochs', '1', '--resume'))
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / 'run').rglob('*')} == before


def test_resume_on_a_finished_run_says_so_in_one_line_exits_0_and_writes_nothing(labeled_images, tmp_path):
    """It validated again, rewrote metrics.json and added a TensorBoard file, without a word."""
    data, labels = labeled_images
    args = train_args(data, labels, tmp_path / 'run', '--epochs', '1', '--workers', '0')
    succeeded(run_tool('train_cls.py', args))
    before = {path: path.stat().st_mtime_ns for path in (tmp_path / 'run').rglob('*')}
    result = succeeded(run_tool('train_cls.py', [*args, '--resume']))
    assert result.stderr.strip().splitlines()[-1] == (f'nothing to do: {tmp_path / "run"} holds a finished run '
                                                      f'(metrics.json is written after its last epoch): a new run '
                                                      f'(more epochs, other settings) needs another --output')
    assert 'top-1' not in result.stdout
    assert {path: path.stat().st_mtime_ns for path in (tmp_path / 'run').rglob('*')} == before
