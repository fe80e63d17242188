"""Where a classification data set's images come from, behind one interface (`source.open_split`): webdataset shards
as timm and the Hub publish them (`wds`), tars read in place (`tars`), splits saved by Hugging Face `datasets`
(`hf_datasets`, an optional extra), the fine-grained transfer sets in their published layouts (`transfer_sets`), and
class folders, the default (`class_folders`). Importing the package registers them."""
from classification.sources import (  # noqa: F401  (registration)
    class_folders,
    hf_datasets,
    source,
    tars,
    transfer_sets,
    wds,
)
