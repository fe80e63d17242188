"""The token-labeling paper's ablations in miniature (tools/reproduce_token_labeling.py), by concern: the rows and the
paper's tables they fill (`rows`), the commands that pretrain, transfer and test each row (`runs`), the summary over
seeds with its paired comparisons (`summary`), its tables (`tables`) and its figures (`plots`)."""
