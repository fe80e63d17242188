"""Speed of CIFAR transfer (the training step of tools/transfer_cifar.py, evaluation, the projected 60-epoch run,
the on-device input pipeline against per-image PIL transforms): the logic of tools/benchmark_transfer.py."""
from __future__ import annotations

import argparse

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

from backbones.common.cli import command_parser, non_negative_int, positive_int
from backbones.common.devices import add_amp_argument, add_device_argument, device_name, pick_amp
from backbones.common.distributed import DistInfo
from backbones.common.log import logger
from classification.data.cifar import CifarInput
from classification.engine.steps import PassOptions, evaluate, train_one_epoch
from classification.engine.trainer import training_state
from classification.objectives.objective import LabelObjective
from classification.recipes import TransferRecipe
from classification.studies.timing import images_per_second
from classification.transfer import build_transfer_model, transfer_param_groups

CIFAR_MEAN, CIFAR_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
TRAIN_IMAGES, VAL_IMAGES, TEST_IMAGES = 45_000, 5_000, 10_000  # CIFAR with a 10% held-out split


def parse_args(argv: list[str] | None = None, description: str | None = None) -> argparse.Namespace:
    p = command_parser(description, 'benchmark_transfer.py')
    p.add_argument('models', nargs='*', default=['t2t_vit_14', 'lvvit_s'], help='the models timed')
    p.add_argument('--batch-size', type=positive_int, default=None,
                   help='images per step (default: 64 on GPU (the recipe), 16 on CPU)')
    p.add_argument('--img-size', type=positive_int, default=224, help='the size CIFAR\'s images are upsampled to')
    add_device_argument(p)
    add_amp_argument(p)
    p.add_argument('--steps', type=positive_int, default=3, help='timed batches per measurement')
    p.add_argument('--warmup', type=non_negative_int, default=1, help='untimed batches before them')
    args = p.parse_args(argv)
    args.device = device_name(args.device)
    return args


def cifar_batches(count: int, batch_size: int, device: torch.device) -> list[dict]:
    """Batches as the transfer loader yields them: uint8 32x32 images, labels, nothing skipped."""
    return [{'image': torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8).to(device),
             'label': torch.randint(0, 100, (batch_size,)).to(device), 'skipped': 0} for _ in range(count)]


def transfer_speed(name: str, args: argparse.Namespace, info: DistInfo, amp: str) -> dict:
    """Training and evaluation images/s of the transfer step at `img_size` (CIFAR-100 head)."""
    recipe = TransferRecipe()
    model, _ = build_transfer_model(name, 100, args.img_size, recipe)
    optimization = recipe.optimization(args.batch_size)
    params = transfer_param_groups(model, optimization.lr, recipe.backbone_lr_scale, optimization.weight_decay)
    state, _ = training_state(model, params, optimization, TRAIN_IMAGES // args.batch_size, amp, info.device)
    objective = LabelObjective(100, 0.0)
    train_tf = CifarInput(args.img_size, CIFAR_MEAN, CIFAR_STD, train=True)
    eval_tf = CifarInput(args.img_size, CIFAR_MEAN, CIFAR_STD, train=False)
    batches = cifar_batches(1, args.batch_size, info.device)
    return {
        'train_img_s': images_per_second(
            lambda: train_one_epoch(model, batches, objective, state, info, PassOptions(amp, transform=train_tf)),
            args.batch_size, args.steps, args.warmup),
        'eval_img_s': images_per_second(
            lambda: evaluate(model, batches, info, amp, transform=eval_tf),
            args.batch_size, args.steps, args.warmup),
    }


def pipeline_speed(args: argparse.Namespace, device: torch.device) -> dict:
    """Images/s of the reference's per-image PIL transforms (one CPU process) and ours (batched on `device`)."""
    size = args.img_size
    reference = transforms.Compose([
        transforms.Resize(size), transforms.RandomCrop(size, padding=size // 8), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(CIFAR_MEAN, CIFAR_STD)])
    pil = [Image.fromarray(img) for img in np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3), np.uint8)]
    ours = CifarInput(size, CIFAR_MEAN, CIFAR_STD, train=True)
    batch = cifar_batches(1, len(pil), device)[0]['image']
    return {'reference_img_s': images_per_second(lambda: [reference(img) for img in pil], len(pil), 1, 0),
            'ours_img_s': images_per_second(lambda: ours(batch), len(pil), 5, 1)}


def hours(seconds: float) -> str:
    return f'{seconds / 3600:.2f} h' if seconds < 360_000 else f'{seconds / 86_400:.0f} days'


def main(argv: list[str] | None = None, description: str | None = None) -> None:
    """tools/benchmark_transfer.py."""
    args = parse_args(argv, description)
    info = DistInfo(device=torch.device(args.device))
    args.batch_size = args.batch_size or (64 if info.device.type == 'cuda' else 16)
    amp = pick_amp(args.amp, info.device)
    torch.manual_seed(0)
    logger.info(f'CIFAR transfer at {args.img_size}px, batch {args.batch_size}, {info.device}, amp {amp}, '
                f'{torch.get_num_threads()} threads')
    pipe = pipeline_speed(args, info.device)
    logger.info(f"input pipeline: reference PIL transforms {pipe['reference_img_s']:8.0f} img/s per process, "
                f"on-device batch {pipe['ours_img_s']:8.0f} img/s  "
                f"(x{pipe['ours_img_s'] / pipe['reference_img_s']:.1f})")
    for name in args.models:
        speed = transfer_speed(name, args, info, amp)
        epoch = TRAIN_IMAGES / speed['train_img_s'] + VAL_IMAGES / speed['eval_img_s']
        total = 60 * epoch + TEST_IMAGES / speed['eval_img_s']
        logger.info(f"{name:12s} train {speed['train_img_s']:8.2f} img/s   eval {speed['eval_img_s']:8.2f} img/s   "
                    f"epoch {hours(epoch)}   60 epochs + test {hours(total)}")
