"""A dense config's training schedule edited: shortened to a number of iterations, stretched for gradient
accumulation, a one-step warm-up dropped, and described in one line."""
from __future__ import annotations

from collections.abc import Collection

from mmengine.config import Config


def describe_schedule(cfg: Config) -> str:
    """The schedule a run takes, in one line."""
    first, decay = cfg.param_scheduler[0], cfg.param_scheduler[-1]
    warmup = first.get('end', 0) if first['type'] == 'LinearLR' else 0
    accumulate = cfg.optim_wrapper.get('accumulative_counts', 1)
    batches = (f', {accumulate} accumulated per update' if accumulate > 1 else '')
    return (f'{cfg.train_cfg["max_iters"]} iterations of {cfg.train_dataloader["batch_size"]} images{batches}, '
            f'lr {cfg.optim_wrapper.optimizer["lr"]:.3g} ({warmup} warm-up, then to '
            f'{decay.get("eta_min", 0):.3g}), validation every {cfg.train_cfg["val_interval"]}, checkpoint every '
            f'{cfg.default_hooks["checkpoint"]["interval"]}')


def accumulate_gradients(cfg: Config, steps: int) -> None:
    """One optimizer update every `steps` iterations (mmengine's `accumulative_counts`): every count of the schedule
    multiplied by `steps`, so the config's updates follow the same lr curve with `steps` times the batch."""
    if steps == 1:
        return
    cfg.optim_wrapper['accumulative_counts'] = steps
    cfg.train_cfg['max_iters'] *= steps
    cfg.train_cfg['val_interval'] *= steps
    for scheduler in cfg.param_scheduler:
        for key in ('begin', 'end'):
            if key in scheduler:
                scheduler[key] *= steps
        if 'milestones' in scheduler:  # a step schedule's (ViTDet's)
            scheduler['milestones'] = [m * steps for m in scheduler['milestones']]
    cfg.default_hooks['checkpoint']['interval'] *= steps


def drop_one_step_warmup(cfg: Config) -> None:
    """A one-iteration warm-up dropped: LinearLR would never leave its start factor (the whole run at 1e-6 lr)."""
    phases = cfg.param_scheduler
    if len(phases) > 1 and phases[0]['type'] == 'LinearLR' and phases[0].get('end', 0) - phases[0].get('begin', 0) == 1:
        cfg.param_scheduler = phases[1:]


def shorten_schedule(cfg: Config, iters: int, given: Collection[str] = (),
                     validate_at_checkpoints: bool = False) -> None:
    """Run the schedule in `iters` iterations: warm-up, decay and checkpoint interval shrink with it, validation at
    the end (or at every checkpoint); intervals the command line's --cfg-options name (`given`) keep their values."""
    factor = iters / cfg.train_cfg['max_iters']
    cfg.train_cfg['max_iters'] = iters
    for scheduler in cfg.param_scheduler:
        for key in ('begin', 'end'):
            if key in scheduler:
                scheduler[key] = min(iters, max(1 if scheduler[key] else 0, round(scheduler[key] * factor)))
        if 'milestones' in scheduler:  # a step schedule's (ViTDet's) lr drops, at the same fractions of the run
            scheduler['milestones'] = [min(iters, max(1, round(m * factor))) for m in scheduler['milestones']]
    # a phase left with no iteration (the decay of a 1-iteration run) is dropped: mmengine refuses begin == end
    cfg.param_scheduler = [s for s in cfg.param_scheduler if s.get('end', iters) > s.get('begin', 0)]
    checkpoint, log = cfg.default_hooks['checkpoint'], cfg.default_hooks['logger']
    if 'default_hooks.checkpoint.interval' not in given:
        checkpoint['interval'] = max(1, round(checkpoint['interval'] * factor))
    if 'train_cfg.val_interval' not in given:
        cfg.train_cfg['val_interval'] = checkpoint['interval'] if validate_at_checkpoints else iters
    if 'default_hooks.logger.interval' not in given:
        log['interval'] = min(log['interval'], checkpoint['interval'])
