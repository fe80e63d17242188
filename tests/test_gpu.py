"""The suite on a CUDA GPU, each part against its CPU result: the batched augmentation's device half, bf16 training
steps (token labeling, distillation, torch.compile), the overlapped loop, fused AdamW, label generation (fp32 and
bf16), segmentation training and its single- and multi-scale tests, and an NCCL process group. `pytest -m gpu`
runs them; without CUDA they are skipped."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

import backbones  # noqa: F401
from backbones.common.distributed import DistInfo
from backbones.common.random_state import seed_all
from classification.data.augment import TrainTransform
from classification.data.batch_augment import BatchAugment, RegionTransform, collate_regions
from classification.engine.trainer import Optimization, optimization_state
from classification.token_labeling.annotate import generate_token_labels
from classification.train import main
from helpers.cls_data import textured_jpegs
from helpers.commands import ENV, ROOT, free_port, run_python, run_tool, succeeded
from helpers.label_stores import assert_same_annotation
from helpers.models import TINY_DEIT
from helpers.seg_data import independent_scores, write_tiny_ade, write_tiny_config
from helpers.training_runs import last_weights, read_log

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')]

CUDA = torch.device('cuda', 0)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Training runs whose data and forward draw nothing: what differs between two of them is how they compute.
FIXED = ['--epochs', '2', '--workers', '0', '--auto-augment', 'none', '--hflip', '0', '--scale-min', '1',
         '--reprob', '0', '--mix-token', '0', '--drop-path', '0', '--ema-decay', '0', '--interpolation', 'bilinear']


def tiny_run(data, output, device, *extra):
    return [*TINY_DEIT, '--data-dir', str(data), '--output', str(output), '--img-size', '32', '--batch-size', '4',
            '--lr-base', '1e-3', '--lr-base-batch', '4', '--warmup-epochs', '1', '--device', device, *FIXED, *extra]


def assert_losses_close(a, b, rel: float) -> None:
    log_a, log_b = read_log(a), read_log(b)
    assert sorted(log_a) == sorted(log_b) == [1, 2]
    for epoch in log_a:
        assert log_b[epoch]['train_loss'] == pytest.approx(log_a[epoch]['train_loss'], rel=rel), epoch


def test_batched_augmentation_on_cuda_equals_its_cpu_result(tmp_path):
    """The device half (grid_sample per interpolation, Pillow's colour ops, normalisation) on a batch of 24 regions
    of JPEG and PNG files with the full RandAugment: the same images on CUDA as on the CPU (erasing draws its noise
    from the device's generator, so it is off here)."""
    rng = np.random.default_rng(0)
    transform = TrainTransform(64, reprob=0.0, mean=MEAN, std=STD)
    worker = RegionTransform(transform)
    regions, plans = [], []
    for i in range(24):
        w, h = rng.integers(80, 400, 2)
        file = tmp_path / f'{i}.{"jpg" if i % 2 else "png"}'
        y, x = np.mgrid[0:h, 0:w]
        Image.fromarray(np.uint8(np.stack([x * 255 / w, y * 255 / h, (x * y) % 251], -1))).save(file)
        torch.manual_seed(i)
        region, _, plan = worker(file)
        regions.append(region)
        plans.append(plan)
    pending = collate_regions(regions, plans)
    device_half = BatchAugment(64, MEAN, STD)
    on_cpu = device_half(pending)
    on_gpu = device_half(pending.to(CUDA)).cpu()
    grey = ((on_gpu - on_cpu) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    # Rounding ties of the resampling, at most: a tie decides a grey level either way, and a contrast stretch after
    # it (AutoContrast, Equalize) can widen that to a few levels, so the count of such pixels is what is bounded.
    assert (grey > 0.01).float().mean() < 0.005 and grey.mean() < 0.02


def test_nvjpeg_decodes_as_pillow_does_and_the_batched_path_agrees(tmp_path):
    """--decode gpu: nvJPEG's pixels against Pillow's (libjpeg-turbo) within JPEG decoders' tolerance (their IDCT and
    chroma upsampling differ by a few levels at colour edges), and a batch decoded on the GPU through the device half
    against the workers' decode on the CPU, the same draws: to under two grey levels on average."""
    files = textured_jpegs(tmp_path, [(500, 375), (375, 500), (640, 480), (300, 300)])
    for file in files:
        on_gpu = decode_jpeg(torch.frombuffer(bytearray(file.read_bytes()), dtype=torch.uint8),
                             mode=ImageReadMode.RGB, device=CUDA).permute(1, 2, 0).cpu().int()
        diff = (on_gpu - torch.from_numpy(np.asarray(Image.open(file).convert('RGB')).copy()).int()).abs()
        # nvJPEG's chroma upsampling is not libjpeg-turbo's 'fancy' one: on an H100 (torch 2.11, torchvision 0.26)
        # the first file differed by 1.44 levels on average, the most in blue; the bound of 1.0 set before any GPU
        # run was a guess
        assert diff.float().mean() < 2.0 and (diff > 8).float().mean() < 0.01, file
    transform = TrainTransform(64, reprob=0.0, mean=MEAN, std=STD)
    made = {}
    for decode, device in (('worker', torch.device('cpu')), ('device', CUDA)):
        items = []
        for s, file in enumerate(files):
            seed_all(s)  # the same draws for both
            items.append(RegionTransform(transform, decode)(file))
        batch = collate_regions([item[0] for item in items], [item[2] for item in items]).to(device)
        made[decode] = BatchAugment(64, MEAN, STD)(batch).cpu()
    grey = ((made['worker'] - made['device']) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    assert grey.mean() < 2.0


def test_bf16_token_labeling_steps_on_cuda_train_like_fp32_on_cpu(labeled_images, tmp_path):
    """LV-ViT's recipe (token targets, the token head) with bf16 autocast, fused AdamW and the batched augmentation
    that --augment auto picks on a GPU: the losses of the fp32 CPU run with the batched path, to bf16's precision."""
    data, labels = labeled_images
    common = ['--token-label-dir', str(labels), '--token-labeling']
    main(tiny_run(data, tmp_path / 'cpu', 'cpu', *common, '--augment', 'batched'))
    metrics = main(tiny_run(data, tmp_path / 'gpu', 'cuda', *common, '--amp', 'bf16'))
    assert_losses_close(tmp_path / 'cpu', tmp_path / 'gpu', rel=2e-2)
    assert metrics['top1'] is not None and all(w.is_floating_point() and w.isfinite().all()
                                               for w in last_weights(tmp_path / 'gpu').values())


def test_overlapped_loop_on_cuda_trains_like_the_serial_one(labeled_images, tmp_path):
    """Batches prepared two ahead by the prefetcher, on its thread and stream (copy, the batched path's device half,
    the map targets), against --serial-loop, bf16 token labeling on the GPU with its random draws (erasing's noise
    drawn from each batch's own seed): the same losses to bf16's precision."""
    data, labels = labeled_images
    common = ['--token-label-dir', str(labels), '--token-labeling', '--amp', 'bf16', '--augment', 'batched',
              '--reprob', '0.25', '--mix-token', '1']
    main(tiny_run(data, tmp_path / 'overlapped', 'cuda', *common))
    main(tiny_run(data, tmp_path / 'serial', 'cuda', *common, '--serial-loop'))
    assert_losses_close(tmp_path / 'serial', tmp_path / 'overlapped', rel=1e-2)


@pytest.mark.parametrize('decode, compiled', [('cpu', False), ('gpu', False), ('gpu', True)])
def test_nothing_between_two_updates_of_the_cuda_loop_waits_for_the_device(labeled_images, tmp_path, monkeypatch,
                                                                          decode, compiled):
    """After two warm-up updates of each pass, torch's sync debug mode turns every host sync into an error until the
    pass's end sums its loss, on the training thread and the prefetcher's alike: bf16 token labeling with MixToken,
    erasing, the EMA and the batched augmentation (its JPEGs decoded by the workers or by nvJPEG), eager and
    compiled, 2 epochs of 12 updates (20 watched). The losses are read one step late from pinned memory, the device
    half's groups come from the host, and the decoder's images are kept from reuse by stream marks, not a wait."""
    from classification.engine import steps
    data, labels = labeled_images
    watched = []

    def update_then_watch(model, state, clip_grad):
        update(model, state, clip_grad)
        if state.num_updates % 12 >= 2:  # each pass's third update on
            torch.cuda.set_sync_debug_mode('error')
            watched.append(state.num_updates)

    def pass_end_sum(values, info):
        torch.cuda.set_sync_debug_mode(0)  # the pass's one sync, after its last update
        return all_reduce_sum(values, info)

    update, all_reduce_sum = steps.update, steps.all_reduce_sum
    monkeypatch.setattr(steps, 'update', update_then_watch)
    monkeypatch.setattr(steps, 'all_reduce_sum', pass_end_sum)
    torch._dynamo.reset()
    try:
        main(tiny_run(data, tmp_path / 'run', 'cuda', '--token-label-dir', str(labels), '--token-labeling',
                      '--amp', 'bf16', '--augment', 'batched', '--reprob', '0.25', '--mix-token', '1',
                      '--ema-decay', '0.9', '--batch-size', '2', '--decode', decode,
                      *(['--compile'] if compiled else [])))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len(watched) >= 20  # the updates after each pass's second ran under the debug mode
    assert read_log(tmp_path / 'run')[2]['train_loss'] > 0


def test_bf16_distillation_on_cuda_trains_like_fp32_on_cpu(labeled_images, tmp_path):
    data, _ = labeled_images
    torch.manual_seed(0)
    teacher = tmp_path / 'teacher.pth'
    torch.save(timm.create_model('resnet10t', num_classes=3).state_dict(), teacher)
    common = ['--teacher', 'resnet10t', '--teacher-checkpoint', str(teacher), '--augment', 'pil']
    main(tiny_run(data, tmp_path / 'cpu', 'cpu', *common))
    main(tiny_run(data, tmp_path / 'gpu', 'cuda', *common, '--amp', 'bf16'))
    assert_losses_close(tmp_path / 'cpu', tmp_path / 'gpu', rel=2e-2)


def test_compiled_steps_on_cuda_train_like_eager_ones(labeled_images, tmp_path):
    data, labels = labeled_images
    common = ['--token-label-dir', str(labels), '--token-labeling', '--amp', 'bf16']
    main(tiny_run(data, tmp_path / 'eager', 'cuda', *common))
    torch._dynamo.reset()
    main(tiny_run(data, tmp_path / 'compiled', 'cuda', *common, '--compile'))
    assert torch._dynamo.utils.counters['stats']['unique_graphs'] > 0
    assert_losses_close(tmp_path / 'eager', tmp_path / 'compiled', rel=1e-2)


def test_fused_adamw_on_cuda_takes_the_unfused_steps():
    """The trainer builds AdamW fused on CUDA; five of its steps, on the same gradients, equal torch's unfused
    AdamW's."""
    torch.manual_seed(0)
    model = timm.create_model('resnet10t', num_classes=3).to(CUDA)
    reference = timm.create_model('resnet10t', num_classes=3).to(CUDA)
    reference.load_state_dict(model.state_dict())
    start = model.fc.weight.detach().clone()
    optimization = Optimization('adamw', 1e-3, 0.05, epochs=1)
    state, _ = optimization_state(model, model, optimization, updates_per_epoch=5, amp='bf16')
    assert all(group['fused'] for group in state.optimizer.param_groups)
    plain, _ = optimization_state(reference, reference, optimization, updates_per_epoch=5, amp='none')
    for group in plain.optimizer.param_groups:
        group['fused'] = None
    for _ in range(5):
        for a, b in zip(model.parameters(), reference.parameters()):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        state.optimizer.step()
        plain.optimizer.step()
    for (name, a), b in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)
    assert not torch.equal(model.fc.weight, start)  # the steps did move the weights


@pytest.mark.parametrize('amp, tolerance, agreement', [('none', 0.02, 0.99), ('bf16', 0.03, 0.9)])
def test_label_generation_on_cuda_equals_the_cpu_store(labeled_images, tmp_path, amp, tolerance, agreement):
    """fp32 on CUDA (cuDNN's convolutions may use TF32) and bf16 on CUDA against the CPU's fp32 store."""
    data, cpu_store = labeled_images
    annotator = cpu_store.parent / 'annotator.pth'
    generate_token_labels(data, 'resnet10t', tmp_path / 'gpu', DistInfo(device=CUDA), checkpoint=str(annotator),
                          img_size=64, topk=2, workers=2, amp=amp)
    assert_same_annotation(cpu_store, tmp_path / 'gpu', tolerance, agreement)


def test_segmentation_training_and_tests_on_cuda(tmp_path):
    """train_seg.py (mmengine picks the GPU) and test_seg.py single-scale and multi-scale + flip: reports equal to
    an independent count over the saved predictions."""
    data = write_tiny_ade(tmp_path / 'ade')
    config = write_tiny_config(tmp_path / 'tiny.py', 'upernet_lvvit_s.py', data)
    trained = succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'work', '--iters', '4']))
    assert 'memory:' in trained.stdout + trained.stderr  # mmengine logs GPU memory of CUDA runs only
    for mode in ('ss', 'ms'):
        out, preds = tmp_path / f'{mode}.json', tmp_path / f'pred_{mode}'
        succeeded(run_tool('test_seg.py', [config, tmp_path / 'work' / 'iter_4.pth', '--out', out, '--pred-dir',
                                           preds, *(['--ms'] if mode == 'ms' else [])]))
        report = json.loads(out.read_text())
        expected = independent_scores(preds, data / 'annotations' / 'validation')
        assert report['mIoU'] == pytest.approx(expected['mIoU'], abs=1e-6), mode


def test_a_one_process_nccl_group_reduces_and_trains_with_ddp():
    """torchrun's environment for one process: the suite's NCCL group, a reduction, the stop agreement's sums one
    round late (through pinned memory, behind a long queue on the stream), DDP's gradients equal to the plain
    model's."""
    script = textwrap.dedent('''
        import torch, torch.nn as nn
        from torch.nn.parallel import DistributedDataParallel
        from backbones.common.distributed import DistInfo, LaggingSum, all_reduce_sum, init_distributed, cleanup
        import torch.distributed as dist
        dist.init_process_group('nccl', device_id=torch.device('cuda', 0))
        info = init_distributed('cuda')
        assert dist.get_backend() == 'nccl' and info.device == torch.device('cuda', 0)
        t = torch.arange(4.0, device=info.device)
        dist.all_reduce(t)
        assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert all_reduce_sum([1.5, 2.0], DistInfo(0, 2, 0, info.device)) == [1.5, 2.0]
        agreement = LaggingSum(DistInfo(0, 2, 0, info.device), 2)
        assert agreement.exchange([1.0, 0.0]) == [0.0, 0.0]
        busy = torch.randn(4096, 4096, device='cuda')
        for _ in range(20):
            busy = busy @ busy / 64  # queued work the next exchange must not wait for, nor be confused by
        assert agreement.exchange([0.0, 1.0]) == [1.0, 0.0] and agreement.read() == [0.0, 1.0]
        torch.manual_seed(0)
        model = nn.Linear(8, 3).cuda()
        ddp = DistributedDataParallel(nn.Linear(8, 3).cuda(), device_ids=[0])
        ddp.module.load_state_dict(model.state_dict())
        x = torch.randn(5, 8, device='cuda')
        model(x).square().sum().backward()
        ddp(x).square().sum().backward()
        torch.testing.assert_close(ddp.module.weight.grad, model.weight.grad)
        dist.destroy_process_group()
        print('nccl ok')
    ''')
    env = {'RANK': '0', 'LOCAL_RANK': '0', 'WORLD_SIZE': '1', 'MASTER_ADDR': '127.0.0.1',
           'MASTER_PORT': str(free_port())}
    result = succeeded(run_python(['-c', script], env={**ENV, **env}))
    assert 'nccl ok' in result.stdout


def test_released_labels_train_on_cuda_like_on_cpu(tmp_path):
    """An imported TokenLabeling tree (centre-square maps) trains with token labeling and with --preset relabel on
    the GPU (batched augmentation, bf16) like on the CPU (fp32, the batched path too)."""
    from test_released_labels import TINY_LVVIT, write_release

    from classification.token_labeling.released_labels import import_released_labels
    from helpers.cls_data import make_image_folder
    data = make_image_folder(tmp_path / 'data')
    import_released_labels(data, write_release(data, tmp_path / 'tree', 'tokenlabeling'), tmp_path / 'store',
                           DistInfo(), workers=0)
    for preset in ('token-labeling', 'relabel'):
        args = [*TINY_LVVIT, '--data-dir', str(data), '--token-label-dir', str(tmp_path / 'store'), '--preset', preset,
                '--img-size', '32', '--batch-size', '4', '--lr-base-batch', '4', '--warmup-epochs', '1', *FIXED]
        main([*args, '--output', str(tmp_path / f'{preset}_cpu'), '--device', 'cpu', '--augment', 'batched'])
        main([*args, '--output', str(tmp_path / f'{preset}_gpu'), '--device', 'cuda', '--amp', 'bf16'])
        assert_losses_close(tmp_path / f'{preset}_cpu', tmp_path / f'{preset}_gpu', rel=2e-2)


def test_a_cuda_run_stopped_mid_epoch_resumes_to_the_same_end(labeled_images, tmp_path):
    """SIGTERM mid-epoch on the GPU (bf16, accumulation, loader workers, the batched augmentation): exit 75, then
    --resume ends where the uninterrupted run ends (to the GPU's run-to-run precision)."""
    from helpers.training_runs import resume_after_stops
    data, labels = labeled_images
    args = [*TINY_DEIT, '--data-dir', data, '--token-label-dir', labels, '--token-labeling', '--epochs', '3',
            '--workers', '2', '--img-size', '32', '--batch-size', '2', '--lr-base-batch', '4', '--device', 'cuda',
            '--amp', 'bf16', '--grad-accum-steps', '2']
    succeeded(run_tool('train_cls.py', [*args, '--output', tmp_path / 'straight']))
    resume_after_stops('train_cls.py', [*args, '--output', tmp_path / 'cut'], tmp_path / 'cut', stops=1)
    straight, cut = read_log(tmp_path / 'straight'), read_log(tmp_path / 'cut')
    for epoch in (1, 2, 3):
        assert cut[epoch]['train_loss'] == pytest.approx(straight[epoch]['train_loss'], rel=1e-3), epoch


def seg_losses(work) -> list[float]:
    """The training losses a train_seg run logged, by iteration."""
    lines = [json.loads(line) for path in work.glob('*/vis_data/scalars.json')
             for line in path.read_text().splitlines()]
    return [line['loss'] for line in sorted(lines, key=lambda line: line['step']) if 'loss' in line]


# every region the samplers see is taken (all anchors, all proposals): their random choice, drawn from the CPU's or
# the GPU's torch generator, would otherwise make the runs differ by more than their precision
TAKE_ALL_REGIONS = ['model.rpn.batch_size_per_image=100000', 'model.rpn.positive_fraction=1.0',
                    'model.roi_heads.batch_size_per_image=100000', 'model.roi_heads.positive_fraction=1.0']


@pytest.mark.parametrize('config_name', ['maskrcnn_lvvit_s.py', 'depth_lvvit_s.py'], ids=['detector', 'depth'])
def test_bf16_detector_and_depth_steps_on_cuda_train_like_fp32_on_cpu(config_name, tmp_path):
    """Three training iterations of the tiny detector (and depth model) in bf16 on the GPU log the losses the same
    iterations log in fp32 on the CPU, within bf16's precision; then test_seg scores the GPU's checkpoint."""
    from helpers.dense_data import write_tiny_coco, write_tiny_dense_config, write_tiny_nyu
    detector = config_name.startswith('maskrcnn')
    data = write_tiny_coco(tmp_path / 'coco') if detector else write_tiny_nyu(tmp_path / 'nyu')
    config = write_tiny_dense_config(tmp_path / 'tiny.py', config_name, data)
    options = ['--iters', '3', '--cfg-options', 'randomness.seed=0', 'default_hooks.logger.interval=1',
               *(TAKE_ALL_REGIONS if detector else [])]
    succeeded(run_python([ROOT / 'tools' / 'train_seg.py', config, '--work-dir', tmp_path / 'cpu', *options],
                         env={**ENV, 'CUDA_VISIBLE_DEVICES': ''}))
    succeeded(run_tool('train_seg.py', [config, '--work-dir', tmp_path / 'gpu', '--amp', 'bf16', *options]))
    cpu, gpu = seg_losses(tmp_path / 'cpu'), seg_losses(tmp_path / 'gpu')
    assert len(cpu) == len(gpu) == 3
    assert gpu == pytest.approx(cpu, rel=0.05)
    tested = succeeded(run_tool('test_seg.py', [config, tmp_path / 'gpu' / 'iter_3.pth']))
    assert ('box_AP' if detector else 'abs_rel') in tested.stdout + tested.stderr
