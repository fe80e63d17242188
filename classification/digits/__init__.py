"""The embedded default data: scikit-learn's handwritten digit scans, which the tools hand the trainers when no real
data set is given: a folder of scans for classification (`cls_data.EmbeddedScans`: recipe, annotator, token labels,
pretrained backbones) and pages of scans in rows for segmentation (`seg_data.EmbeddedPages`: scale, schedule)."""
