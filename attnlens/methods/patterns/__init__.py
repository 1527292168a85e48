"""What each head's map looks like: Kovaleva et al. 2019's five pattern types.

- :func:`classify`: the transparent template classifier of one batch of maps
  (:mod:`attnlens.methods.patterns.templates`, rules and thresholds there);
- :func:`synthetic`: noisy prototype maps of each type (:mod:`attnlens.methods.patterns.synthetic`);
- :class:`PatternCNN`: Kovaleva's small CNN on resized maps, for maps you label
  (:mod:`attnlens.methods.patterns.cnn`);
- :func:`sample_maps`, :func:`export_for_labelling`, :func:`read_labelled`: maps to label by
  hand, as an image grid and a CSV, and back (:mod:`attnlens.methods.patterns.labelling`).
"""

from attnlens.methods.patterns.cnn import PatternCNN
from attnlens.methods.patterns.labelling import export_for_labelling, read_labelled, sample_maps
from attnlens.methods.patterns.synthetic import SyntheticMaps, synthetic
from attnlens.methods.patterns.templates import (
    REGIONS,
    THRESHOLDS,
    TYPES,
    Classification,
    Positions,
    classify,
    features,
)

__all__ = [
    "PatternCNN", "export_for_labelling", "read_labelled", "sample_maps",
    "REGIONS", "THRESHOLDS", "TYPES", "Classification", "Positions", "SyntheticMaps",
    "classify", "features", "synthetic",
]

from attnlens.methods.patterns.counts import PatternTypes, figure, layer_shares, types  # noqa: E402

__all__ += ["PatternTypes", "figure", "layer_shares", "types"]
