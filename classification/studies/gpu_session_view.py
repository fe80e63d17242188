"""What one GPU session (tools/measure_gpu.py, classification/studies/gpu_session.py) measured, as a page shows it
(`view FILE figures`): a list item per figure it holds, in the issue's order of value, then what it did not measure."""
from __future__ import annotations

from collections.abc import Callable

from classification.studies.figure_formats import duration, rate, wrapped
from classification.studies.results_data import DataFiles

MODEL_NAMES = {'lvvit_s': 'LV-ViT-S', 'deit_small_patch16_224': 'DeiT-S'}
INPUT_BOUND = ' (input-bound: it says nothing of the step)'


def gpu_session_figures(files: DataFiles, name: str) -> str:
    """A list item per figure the session of results file `name` holds, then a sentence naming those it does not."""
    session = files.figures(name)
    described = [(label, describe(session)) for label, describe in GPU_FIGURES]
    missing = [label for label, text in described if not text]
    note = '\n\n' + wrapped(f'Not measured in this session: {"; ".join(missing)}.') if missing else ''
    return '\n'.join(wrapped(f'- {label}: {text}', indent='  ') for label, text in described if text) + note


def loop_figures(session: dict) -> dict | None:
    document = session.get('loop_benchmark')
    return document['models'][0] if document and document.get('models') else None


def bound_note(input_bound: bool) -> str:
    """What a ratio of two loops under the same bound says: under the input pipeline, only the pipelines'."""
    return INPUT_BOUND if input_bound else ''


def gpu_against_timm(session: dict) -> str:
    f = loop_figures(session)
    if not f or 'timm_train' not in f:
        return ''
    return (f'`train_cls` {rate(f["train_cls"]["img_s"])} img/s, timm\'s `train.py` {rate(f["timm_train"]["img_s"])} '
            f'img/s: **x{f["timm_train"]["suite_ratio"]:.2f}**{bound_note(f["bound"] == "input pipeline")}')


def gpu_loop(session: dict) -> str:
    """The loop against its step: the benchmark's figures, else its progress lines' (gpu_session.loop_from_progress)."""
    f, progress = loop_figures(session), session.get('loop_from_progress')
    if f and 'loop' in f:
        loop = {'loop_img_s': f['loop']['img_s'], 'step_img_s': f['model_step_img_s'],
                'loop_of_step': f['loop']['of_step'], 'serial_img_s': f['loop'].get('serial_img_s'),
                'overlap_gain': f['loop'].get('overlap_gain'), 'input_bound': f['bound'] == 'input pipeline'}
        bound = f'the {f["bound"]}'
    elif progress:
        loop = progress
        bound = (f'the input pipeline ({rate(loop["pipeline_img_s"])} img/s, batched path)' if loop['input_bound']
                 else 'the model step') + " (from the benchmark's progress lines: its later train_cls window failed)"
    else:
        return ''
    serial = (f', serial loop {rate(loop["serial_img_s"])} img/s (overlap x{loop["overlap_gain"]:.2f})'
              f'{bound_note(loop["input_bound"])}' if loop['serial_img_s'] else '')
    return (f'loop {rate(loop["loop_img_s"])} img/s against its step\'s {rate(loop["step_img_s"])}: '
            f'**x{loop["loop_of_step"]:.2f}**{serial}; bound by {bound}')


def gpu_step(kind: str) -> Callable[[dict], str]:
    def describe(session: dict) -> str:
        steps = session.get('step', {}).get('models', {})
        parts = []
        for model, figures in steps.items():
            step = figures.get(kind)
            if step:
                mfu = (f', MFU {step["mfu"]:.1%} of {step["peak_tflop_s"]:g} TFLOP/s' if step.get('mfu') is not None
                       else '')
                ratio = (f', x{figures["compiled_over_eager"]:.2f} the eager step'
                         if kind == 'compiled' and 'compiled_over_eager' in figures else '')
                parts.append(f'{MODEL_NAMES.get(model, model)}: {rate(step["img_s"])} img/s '
                             f'({step["tflop_s"]:.0f} TFLOP/s{mfu}){ratio}')
        return '; '.join(parts)
    return describe


def gpu_tests(key: str) -> Callable[[dict], str]:
    """A pytest stage's row (the GPU suite's, the sync canary's): its counts, its length, each failure's message."""
    def describe(session: dict) -> str:
        tests = session.get(key)
        if not tests:
            return ''
        failures = ''.join(f'; failed: `{name}` ({why})' for name, why in tests.get('failures', {}).items())
        stopped = ' (stopped by its time limit)' if tests.get('timed_out') else ''
        skipped = f', {tests["skipped"]} skipped' if tests.get('skipped') else ''
        return (f'{tests["passed"]} passed, {tests["failed"]} failed of {tests["ran"]}{skipped} '
                f'in {duration(tests["seconds"])}{stopped}{failures}')
    return describe


def gpu_against(key: str, head: str, faster: tuple[str, str], slower: tuple[str, str],
                ratio: str) -> Callable[[dict], str]:
    """A stage's row of two rates (each a name and its figure's key) and their ratio: '<head>: <name> F img/s,
    <name> S img/s (xRATIO)', `head` formatted with the stage's figures; none before the faster one is measured."""
    def describe(session: dict) -> str:
        figures = session.get(key)
        if not figures or faster[1] not in figures:
            return ''
        return (f'{head.format(**figures)}: {faster[0]} {rate(figures[faster[1]])} img/s, {slower[0]} '
                f'{rate(figures[slower[1]])} img/s (x{figures[ratio]:.2f})')
    return describe


def gpu_decoded_loop(key: str, compiled: bool) -> Callable[[dict], str]:
    """A loop stage's row (gpu_session.loop_stage): the loop against its step in the same process, its data wait."""
    def describe(session: dict) -> str:
        stage = session.get(key)
        figures = next(iter(stage['models'].values()), {}).get('compiled' if compiled else 'eager') if stage else None
        if not figures:
            return ''
        wait = f', waiting for data {figures["data_wait"]:.0%} of the pass' if figures['data_wait'] is not None else ''
        return (f'--decode {stage["decode"]}, {stage["workers"]} workers: loop {rate(figures["loop_img_s"])} img/s '
                f'against its step\'s {rate(figures["step_img_s"])}: **x{figures["loop_of_step"]:.2f}**{wait}')
    return describe


def gpu_dense_steps(session: dict) -> str:
    """The dense_steps stage's row: each config's step, its batch and largest image, its peak device memory."""
    configs = session.get('dense_steps', {}).get('configs', {})
    parts = []
    for name, step in configs.items():
        height, width = step['largest_image']
        memory = f', {step["peak_memory_gib"]:.1f} GiB at its peak' if step['peak_memory_gib'] is not None else ''
        parts.append(f'`{name}` {rate(step["img_s"])} img/s '
                     f'({step["it_s"]:.2f} it/s of {step["batch_size"]}, up to {width}x{height}{memory})')
    windows = session.get('dense_windows')
    if windows:
        ratio = windows['ratios']['windows']
        parts.append(f'Mask R-CNN with window attention against global attention: x{ratio["time"]:.2f} the '
                     f'time of a step, x{ratio["memory"]:.2f} the memory')
    return '; '.join(parts)


# the GPU session's figures in the order of value
GPU_FIGURES = (('the sync canary (the sync-debug test of the loop with `--decode gpu`, eager and compiled)',
                gpu_tests('sync_canary')),
               ('the whole loop against its eager step (DeiT-S)', gpu_decoded_loop('deit_loop', compiled=False)),
               ('the compiled loop against its compiled step (DeiT-S)', gpu_decoded_loop('deit_loop', compiled=True)),
               ('the same for LV-ViT-S with token labeling, eager', gpu_decoded_loop('lvvit_loop', compiled=False)),
               ('the same, compiled', gpu_decoded_loop('lvvit_loop', compiled=True)),
               ("the suite against timm's `train.py` (DeiT-S, steady state)", gpu_against_timm),
               ('the whole loop against its step (DeiT-S, the workers decoding)', gpu_loop),
               ("the trainer's step, eager (bf16, fused AdamW, channels-last)", gpu_step('eager')),
               ('the same, compiled (`--compile`)', gpu_step('compiled')),
               ('the GPU suite (`pytest -m gpu`)', gpu_tests('gpu_tests')),
               ('nvJPEG decoding (`--decode gpu`)',
                gpu_against('decoding', '{workers} workers', ('nvJPEG', 'gpu_img_s'),
                            ("the workers' decoding", 'cpu_img_s'), 'gpu_over_cpu')),
               ('bf16 label generation (`generate_token_labels --amp bf16`)',
                gpu_against('label_generation', '{annotator} at {img_size} px', ('bf16', 'bf16_img_s'),
                            ('fp32', 'fp32_img_s'), 'bf16_over_fp32')),
               ("the dense training steps (LV-ViT-S, fp32, each config's per-GPU batch)", gpu_dense_steps))
