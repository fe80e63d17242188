"""Where a classification data set's images come from, behind one interface (`source.open_split`): tars read in
place (`tars`), the fine-grained transfer sets in their published layouts (`transfer_sets`), and class folders, the
default (`class_folders`). Importing the package registers them."""
from classification.sources import class_folders, source, tars, transfer_sets  # noqa: F401  (registration)
