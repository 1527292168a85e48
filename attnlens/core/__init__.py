"""Layer 1, ``core``: what every analysis stands on.

Inputs and their layouts (:mod:`attnlens.core.inputs`), loading a model
(:mod:`attnlens.core.loading`), the hook seam (:mod:`attnlens.core.seam`), normalization bridges
without unread work (:mod:`attnlens.core.norms`), one file of facts per
architecture (:mod:`attnlens.core.models`), argument checks (:mod:`attnlens.core.checks`), files
(:mod:`attnlens.core.files`), corpora (:mod:`attnlens.core.corpus`), head sets
(:mod:`attnlens.core.heads`), plotly figures of arrays (:mod:`attnlens.core.plots`), the
compact notebook views (:mod:`attnlens.core.notebook`) a model's eval mode for a pass
(:mod:`attnlens.core.modes`) and where host reads are free (:mod:`attnlens.core.devices`). The errors (:mod:`attnlens.errors`) sit here too, a leaf at the
package's root.

Layers, lowest first: ``core`` < ``engine`` < ``methods`` < ``evaluation`` < ``present`` <
``compare`` < ``cli``. A module imports only from its own layer or lower ones, never higher, not
even inside a function (``tests/unit/test_layers.py``). Imports sit at the top of the file; one
waits inside a function only for a reason that test names (e.g. a module that loads plotly).
"""
