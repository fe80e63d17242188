"""The reproduction's rows (each a pretraining recipe, named as the paper's rows), the paper's tables and figures they
fill, and what each row is compared with."""
from __future__ import annotations

from classification.digits.cls_data import ANNOTATOR, ANNOTATORS

PARTICIPATION_RATES = (20, 40, 60, 80)  # percent of each image's tokens in the token loss (Figure 4 left; 100: token
# labeling itself)
OTHER_ANNOTATORS = ANNOTATORS[1:]  # Figure 4 right: token labeling from the digits' larger annotators
VARIANTS = {
    'token-labeling': 'token labeling + MixToken',
    'standard': 'Standard (MixUp + CutMix)',
    'mixtoken-label': 'MixToken, image label only',
    'relabel': 'ReLabel + CutMix',
    'relabel-mixtoken': 'ReLabel + MixToken',
    'cutmix-label': 'CutMix, image label only',
    'token-labeling-no-mixtoken': 'token labeling, no MixToken',
    'online-kd': 'online KD (annotator as DeiT teacher)',
    'online-token-labeling': 'online token labeling',
    'standard-same-lr': 'Standard at token labeling\'s lr',
    **{f'participation-{rate}': f'token labeling, {rate}% of tokens' for rate in PARTICIPATION_RATES},
    **{f'annotator-{name}': f'token labeling, {name} annotator' for name in OTHER_ANNOTATORS},
}
# The rows that are not a preset alone: the preset they start from, and their own options (Figure 4 left: the token
# participation rate; right: the digits' annotator); the online rows add the annotator as --teacher (Table 4);
# `standard-same-lr` is Standard with token labeling's lr, the one factor Standard changes besides the supervision
# and the mixing
DERIVED = {'standard-same-lr': ('standard', []),  # the lr: Stages.pretrain_argv (it depends on the data)
           **{f'participation-{rate}': ('token-labeling', ['--token-participation', f'{rate / 100:g}'])
              for rate in PARTICIPATION_RATES},
           **{f'annotator-{name}': ('token-labeling', ['--digits-annotator', name]) for name in OTHER_ANNOTATORS}}
ONLINE = {'online-kd': 'standard', 'online-token-labeling': 'token-labeling'}
# The paper's own layouts: Table 2 (augmentation x supervision), Table 4 (training, tokens used, time) and Figure 4
# (left: participation rate; right: annotator); a cell whose row did not run is a dash
TABLE2_CELLS = {('MixToken', 'token labeling'): 'token-labeling', ('MixToken', 'ReLabel'): 'relabel-mixtoken',
                ('CutMix', 'ReLabel'): 'relabel', ('MixToken', 'image label'): 'mixtoken-label',
                ('CutMix', 'image label'): 'cutmix-label'}
TABLE4_ROWS = {'standard': ('vanilla', '1'), 'online-kd': ('online KD', '2'),
               'online-token-labeling': ('online token labeling', 'all'), 'token-labeling': ('token labeling', 'all'),
               'relabel': ('ReLabel', '1')}
PARTICIPATION = {**{rate: f'participation-{rate}' for rate in PARTICIPATION_RATES}, 100: 'token-labeling'}
ANNOTATOR_ROWS = {ANNOTATOR: 'token-labeling', **{name: f'annotator-{name}' for name in OTHER_ANNOTATORS}}
DIGITS_ONLY = set(ANNOTATOR_ROWS.values()) - {'token-labeling'}  # the annotators are the digits' own
# The paper's tables as rows of this tool (`--table`). Table 7 transfers backbones to segmentation: with and without
# token labeling as the paper's, and MixToken with the image label, which differs from token labeling in the
# supervision alone. Table 4's Standard row comes with its one-factor twin at token labeling's lr.
TABLES = {'2': tuple(TABLE2_CELLS.values()), '4': (*TABLE4_ROWS, 'standard-same-lr'),
          '7': ('token-labeling', 'standard', 'mixtoken-label'),
          'fig4': (*PARTICIPATION.values(), *ANNOTATOR_ROWS.values())}
DEFAULT_TABLES = ('2', '4', '7')  # Figure 4 adds its six rows (--table fig4): docs/reproduction.md has the times
BASELINE = 'token-labeling'  # every other variant is compared with it, seed by seed
# The paper's other comparisons, each row minus the row it is set against (where both ran): online token labeling
# against online KD, each online row against its offline one (token labeling's is in every row's summary), the pooled
# map against the image label under MixToken, and Standard at token labeling's lr against Standard
PAIRS = (('online-token-labeling', 'online-kd'), ('online-kd', 'standard'), ('relabel-mixtoken', 'mixtoken-label'),
         ('standard-same-lr', 'standard'))
HEADS = {'fcn': 'FCN', 'upernet': 'UperNet'}
MODES = {'ss': 'SS', 'ms': 'MS'}
SEG_METRICS = ('mIoU', 'aAcc')
