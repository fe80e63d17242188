"""The embedded default data: scikit-learn's handwritten digit scans, used by every tool when no real data set is
on disk, and the classification runs that prepare what the tools need from them (annotator, token labels, and
digits-pretrained backbones for segmentation)."""
