"""What token labeling costs against baselines in the same run (the training step, the target builder, the label
store): the logic of tools/benchmark_token_labeling.py."""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from torchvision.ops import roi_align

from backbones.common.cli import command_parser, non_negative_int, positive_int
from backbones.common.devices import TIMED_IN_FP32, add_amp_argument, add_device_argument, device_name
from backbones.common.log import logger
from backbones.common.outputs import output_file
from backbones.common.random_state import seed_all
from classification.data.augment import CropGeometry
from classification.models import create_classifier
from classification.objectives.objective import LabelObjective, TokenLabelingObjective
from classification.objectives.token_loss import TokenLabelingLoss
from classification.objectives.token_targets import TokenTargetBuilder
from classification.studies.results_file import write_results
from classification.studies.timing import seconds_per_call
from classification.token_labeling.label_store import WHOLE_IMAGE


def synthetic_maps(B: int, h: int, k: int, C: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    top = torch.randn(B, h, h, C, device=device).topk(k, dim=-1)
    return top.values.half(), top.indices


def random_geometry(B: int, device) -> CropGeometry:
    x1, y1 = torch.rand(B) * 0.5, torch.rand(B) * 0.5
    box = torch.stack([x1, y1, x1 + 0.2 + torch.rand(B) * 0.3, y1 + 0.2 + torch.rand(B) * 0.3], dim=1)
    return CropGeometry(box.to(device), (torch.rand(B) < 0.5).to(device), torch.eye(3)[:2].expand(B, 2, 3).to(device))


def per_sample_targets(scores, classes, geometry, grid, C: int, smoothing: float):
    """The straightforward way: per image, scatter the top-k into a dense C x h x w map, RoIAlign, flip."""
    cls_targets, token_targets = [], []
    h, w = scores.shape[1:3]
    for i in range(scores.shape[0]):
        dense = torch.zeros(C, h, w, device=scores.device)
        dense.scatter_(0, classes[i].permute(2, 0, 1).long(), scores[i].float().softmax(-1).permute(2, 0, 1))
        box = geometry.box[i] * torch.tensor([w, h, w, h], device=scores.device)
        roi = torch.cat([torch.zeros(1, device=scores.device), box])[None]
        tokens = roi_align(dense[None], roi, grid, 1.0, 2, aligned=True)[0]
        cls = roi_align(dense[None], roi, (1, 1), 1.0, 2 * grid[0], aligned=True)[0, :, 0, 0]
        if geometry.flip[i]:
            tokens = tokens.flip(-1)
        token_targets.append(tokens.permute(1, 2, 0) * (1 - smoothing) + smoothing / C)
        cls_targets.append(cls * (1 - smoothing) + smoothing / C)
    return torch.stack(cls_targets), torch.stack(token_targets)


def bench_train_step(args, device) -> dict:
    """One training step (forward, loss, backward, AdamW) with token labeling against plain cross-entropy, through
    the training tool's own model and objective: any model, a CNN included (its last feature map the token grid)."""
    B, C, size = args.batch_size, args.num_classes, args.img_size
    x = torch.randn(B, 3, size, size, device=device)
    labels = torch.randint(C, (B,), device=device)
    scores, classes = synthetic_maps(B, args.map_size, 5, C, device)
    batch = {'label': labels, 'scores': scores, 'classes': classes, 'geometry': random_geometry(B, device),
             'extent': torch.tensor(WHOLE_IMAGE).expand(B, 4), 'has_map': torch.ones(B, dtype=torch.bool)}
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == 'bf16')
    grids = []

    def make(token_labeling: bool):
        torch.manual_seed(0)
        model = create_classifier(args.model, C, size, token_labeling=token_labeling).to(device).train()
        objective = TokenLabelingObjective(C, 0.1, token_builder=TokenTargetBuilder(C),
                                           token_loss=TokenLabelingLoss(0.5)) \
            if token_labeling else LabelObjective(C, 0.1)
        opt = torch.optim.AdamW(model.parameters(), 1e-4)

        def step():
            with amp:
                images, targets = objective.prepare(x, labels)
                out = model(images)
            if token_labeling:
                grids.append(tuple(out.token_logits.shape[1:3]))
            loss = objective.loss(out, batch, targets, device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    plain, tl = make(False), make(True)
    # interleave repeats so drift of the machine's speed hits both alike
    plain_t, tl_t = [], []
    for _ in range(args.repeats):
        plain_t.append(seconds_per_call(plain, args.steps, args.warmup))
        tl_t.append(seconds_per_call(tl, args.steps, args.warmup))
    p, t = float(np.median(plain_t)), float(np.median(tl_t))
    return {'model': args.model, 'batch': B, 'img_size': size, 'token_grid': grids[-1], 'plain_ce_s': p,
            'token_labeling_s': t, 'overhead_pct': 100 * (t / p - 1)}


def bench_builder(args, device) -> dict:
    B, C, S = args.builder_batch, args.num_classes, args.img_size // 16
    scores, classes = synthetic_maps(B, args.map_size, 5, C, device)
    geometry = random_geometry(B, device)
    builder = TokenTargetBuilder(C, 0.1)
    ours = seconds_per_call(lambda: builder(scores, classes, geometry, (S, S)), args.steps, 2)
    naive = seconds_per_call(lambda: per_sample_targets(scores, classes, geometry, (S, S), C, 0.1),
                             max(2, args.steps // 3), 1)
    a = builder(scores, classes, geometry, (S, S))
    b = per_sample_targets(scores, classes, geometry, (S, S), C, 0.1)
    return {'batch': B, 'classes': C, 'map': args.map_size, 'grid': S, 'batched_img_s': B / ours,
            'per_sample_img_s': B / naive, 'speedup': naive / ours,
            'max_abs_difference': max((a[0] - b[0]).abs().max().item(), (a[1] - b[1]).abs().max().item())}


def bench_store(args) -> dict:
    N, h, k = args.store_images, args.map_size, 5
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((N, h, h, k)).astype(np.float16)
    classes = rng.integers(0, args.num_classes, (N, h, h, k)).astype(np.int16)
    order = rng.permutation(N)
    with tempfile.TemporaryDirectory(dir=args.tmp_dir) as tmp:
        tmp = Path(tmp)
        np.save(tmp / 'scores.npy', scores)
        np.save(tmp / 'classes.npy', classes)
        files = tmp / 'files'
        files.mkdir()
        for i in range(N):  # the reference layout: one small torch file per image
            torch.save(torch.stack([torch.from_numpy(scores[i].astype(np.float32)),
                                    torch.from_numpy(classes[i].astype(np.float32))]), files / f'{i}.pt')
        packed_bytes = (os.path.getsize(tmp / 'scores.npy') + os.path.getsize(tmp / 'classes.npy')) / N
        file_bytes = sum(os.path.getsize(files / f'{i}.pt') for i in range(N)) / N
        file_disk = sum(os.stat(files / f'{i}.pt').st_blocks * 512 for i in range(N)) / N

        def read_packed():
            s, c = np.load(tmp / 'scores.npy', mmap_mode='r'), np.load(tmp / 'classes.npy', mmap_mode='r')
            for i in order:
                np.array(s[i]), np.array(c[i])

        def read_files():
            for i in order:
                torch.load(files / f'{i}.pt', weights_only=True)

        packed_s = seconds_per_call(read_packed, 3, 1)
        files_s = seconds_per_call(read_files, 3, 1)
    return {'images': N, 'map': f'{h}x{h}x{k}', 'packed_bytes_per_image': packed_bytes,
            'per_file_bytes_per_image': file_bytes, 'per_file_disk_bytes_per_image': file_disk,
            'packed_reads_per_s': N / packed_s, 'per_file_reads_per_s': N / files_s, 'read_speedup': files_s / packed_s}


PARTS = ('train', 'builder', 'store')


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """tools/benchmark_token_labeling.py's options (`description`: its usage text)."""
    p = command_parser(description, 'benchmark_token_labeling.py')
    p.add_argument('--model', default='lvvit_s', help='the model of the training step (any timm model)')
    p.add_argument('--batch-size', type=positive_int, default=8, help='images per training step')
    p.add_argument('--img-size', type=positive_int, default=224, help='input size of the training step')
    p.add_argument('--num-classes', type=positive_int, default=1000, help='classes of the model and the score maps')
    p.add_argument('--map-size', type=positive_int, default=14, help='score-map side (paper: 18 from NFNet-F6 at 576)')
    p.add_argument('--builder-batch', type=positive_int, default=128, help='images per call of the target builder')
    p.add_argument('--store-images', type=positive_int, default=5000, help='images of the label-store benchmark')
    p.add_argument('--steps', type=positive_int, default=5, help='timed calls per measurement')
    p.add_argument('--warmup', type=non_negative_int, default=2, help='untimed calls before them')
    p.add_argument('--repeats', type=positive_int, default=3,
                   help='measurements of the training steps, interleaved (their median is given)')
    add_amp_argument(p, 'none', TIMED_IN_FP32, ('none', 'bf16'))
    add_device_argument(p)
    p.add_argument('--tmp-dir', help='where the store benchmark writes its files (default: system temp)')
    p.add_argument('--parts', nargs='*', choices=PARTS, default=list(PARTS), help='the measurements to run')
    p.add_argument('--json', type=output_file, help='also write the figures here')
    return p


def main(argv: list[str] | None = None, description: str | None = None) -> dict:
    """tools/benchmark_token_labeling.py."""
    args = build_parser(description).parse_args(argv)
    args.device = device_name(args.device)
    device = torch.device(args.device)
    seed_all(0)
    results = {}
    if 'train' in args.parts:
        results['train_step'] = r = bench_train_step(args, device)
        logger.info(f"train step {r['model']} batch {r['batch']} @{r['img_size']}: plain CE "
                    f"{r['plain_ce_s'] * 1e3:.1f} ms, token labeling + MixToken {r['token_labeling_s'] * 1e3:.1f} "
                    f"ms, overhead {r['overhead_pct']:+.1f}%")
    if 'builder' in args.parts:
        results['target_builder'] = r = bench_builder(args, device)
        logger.info(f"target builder, batch {r['batch']}, {r['classes']} classes, {r['map']}x{r['map']} map -> "
                    f"{r['grid']}x{r['grid']}: batched {r['batched_img_s']:.0f} img/s, per-sample "
                    f"{r['per_sample_img_s']:.0f} img/s, x{r['speedup']:.1f} "
                    f"(max |diff| {r['max_abs_difference']:.1e})")
    if 'store' in args.parts:
        results['label_store'] = r = bench_store(args)
        logger.info(f"label store, {r['images']} images of {r['map']}: packed {r['packed_bytes_per_image']:.0f} "
                    f"B/image, one file per image {r['per_file_bytes_per_image']:.0f} B "
                    f"({r['per_file_disk_bytes_per_image']:.0f} B on disk); random reads packed "
                    f"{r['packed_reads_per_s']:.0f}/s vs files {r['per_file_reads_per_s']:.0f}/s, "
                    f"x{r['read_speedup']:.1f}")
    if args.json:
        write_results(args.json, 'token_labeling_benchmark', 'benchmark_token_labeling.py', argv, results, args.device)
    return results
