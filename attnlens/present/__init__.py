"""Layer 5, ``present``: a comparison as figures and HTML.

The figures of a comparison (:mod:`attnlens.present.figures`), the self-contained report
(:mod:`attnlens.present.report`) with its explorer (:mod:`attnlens.present.explorer`) and 8-bit
maps (:mod:`attnlens.present.kept`), Jupyter's views (:mod:`attnlens.present.display`), exports
to CircuitsVis and BertViz (:mod:`attnlens.present.export`), and the columns and views a
comparison is made of (:mod:`attnlens.present.columns`).

Imports the layers below only, never :mod:`attnlens.comparison`: a comparison reaches these
modules as an argument (see :mod:`attnlens.core` for the layers).
"""
